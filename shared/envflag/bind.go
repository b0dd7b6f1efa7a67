package envflag

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Binding ties every flag of some flag sets to its environment variables, so that no flag can be added without
// one and no variable name has to be written twice (once in the lookup, once in the help).
//
// Use it in two steps around parsing:
//
//	b := envflag.Bind("OUTPOST_", map[string][]string{"omni-endpoint": {"OMNI_ENDPOINT"}},
//		root.PersistentFlags(), root.Flags())  // after every flag is defined: --help now lists each variable
//	...
//	PersistentPreRunE: func(*cobra.Command, []string) error { return b.Apply(os.LookupEnv) }  // after parsing
//
// A flag given on the command line wins over its variables; a variable applies to a flag left at its default
// exactly as if its value had been given as the flag (a list flag takes a comma-separated value). Bind the
// sets of every command, including subcommands' local flags, so that the README's promise holds for all.
type Binding struct {
	flags []*boundFlag
}

type boundFlag struct {
	flag *pflag.Flag
	vars []string // the name made from the flag first, then its aliases
}

// maxShownValue bounds how much of a value that does not parse is quoted back in an error.
const maxShownValue = 64

// VarName is the variable named after a flag: prefix + the flag's name upper-cased, dashes as underscores
// ("OUTPOST_", "wipe-timeout" -> "OUTPOST_WIPE_TIMEOUT").
func VarName(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// commandLineOnly is the annotation CommandLineOnly puts on a flag.
const commandLineOnly = "envflag-command-line-only"

// CommandLineOnly keeps the named flags of fs out of every Binding: they take no variable. For flags of an
// operator's one-off command that share a name with the server's (controller site set --wipe-method beside
// the controller's own --wipe-method): the server's variable, set in the same environment, must not turn into
// a change the operator never typed.
func CommandLineOnly(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, commandLineOnly, []string{"true"}); err != nil {
			panic(fmt.Sprintf("envflag: %v", err))
		}
	}
}

// IsCommandLineOnly reports whether CommandLineOnly marked f.
func IsCommandLineOnly(f *pflag.Flag) bool {
	_, ok := f.Annotations[commandLineOnly]

	return ok
}

// Bind gives every flag in sets the variable VarName(prefix, name), plus the alias variables named in aliases
// by flag name (older or conventional names kept working, such as OMNI_ENDPOINT), and appends the variables
// to each flag's usage ("... [OUTPOST_WIPE_TIMEOUT]") so that --help shows them. A flag that appears in more
// than one set (a cobra persistent flag) is bound once; one marked CommandLineOnly is not bound. Call it after every flag is defined; an alias for a
// flag that does not exist is a programming error and panics.
func Bind(prefix string, aliases map[string][]string, sets ...*pflag.FlagSet) *Binding {
	b := &Binding{}
	seen := map[*pflag.Flag]bool{}

	for _, fs := range sets {
		fs.VisitAll(func(f *pflag.Flag) {
			if seen[f] || IsCommandLineOnly(f) {
				return
			}

			seen[f] = true

			vars := append([]string{VarName(prefix, f.Name)}, aliases[f.Name]...)
			f.Usage += " [" + strings.Join(vars, ", ") + "]"
			b.flags = append(b.flags, &boundFlag{flag: f, vars: vars})
		})
	}

	for name := range aliases {
		if !slices.ContainsFunc(b.flags, func(bf *boundFlag) bool { return bf.flag.Name == name }) {
			panic(fmt.Sprintf("envflag: alias for unknown flag --%s", name))
		}
	}

	return b
}

// Vars returns the variables bound to each flag by flag name, the one made from the flag's name first.
func (b *Binding) Vars() map[string][]string {
	out := make(map[string][]string, len(b.flags))
	for _, bf := range b.flags {
		out[bf.flag.Name] = slices.Clone(bf.vars)
	}

	return out
}

// Apply sets every flag not given on the command line from its variable, looked up with lookup (os.LookupEnv
// in main). A variable set to the empty string counts as set: an empty value (e.g. to disable a listener) is
// applied like --flag="". Variables of one flag that disagree, and values that do not parse as their flag's
// type, are errors naming the variable; Apply reports all of them at once, and a flag whose variable did not
// parse is left with an unspecified value, so the caller stops on the error.
func (b *Binding) Apply(lookup func(string) (string, bool)) error {
	var errs []error

	for _, bf := range b.flags {
		if bf.flag.Changed {
			continue
		}

		name, value, ok, err := bf.value(lookup)
		if err != nil {
			errs = append(errs, err)

			continue
		}

		if !ok {
			continue
		}

		if err := bf.flag.Value.Set(value); err != nil {
			errs = append(errs, parseError(name, value, bf.flag, err))

			continue
		}

		bf.flag.Changed = true
	}

	return errors.Join(errs...)
}

// value finds the flag's variable that is set; two set to different values are an error, since which one the
// operator meant cannot be known.
func (bf *boundFlag) value(lookup func(string) (string, bool)) (name, value string, ok bool, err error) {
	for _, v := range bf.vars {
		got, set := lookup(v)
		if !set {
			continue
		}

		if ok && got != value {
			return "", "", false, fmt.Errorf("environment variables %s and %s both set --%s, to different values", name, v, bf.flag.Name)
		}

		if !ok {
			name, value, ok = v, got, true
		}
	}

	return name, value, ok, nil
}

// parseError names the variable and the flag; the parser's own reason is kept for a short value only, as it
// quotes the value again in full.
func parseError(name, value string, f *pflag.Flag, err error) error {
	if len(value) > maxShownValue {
		return fmt.Errorf("environment variable %s=%q... is not a valid %s for --%s", name, value[:maxShownValue], f.Value.Type(), f.Name)
	}

	return fmt.Errorf("environment variable %s=%q is not a valid %s for --%s: %w", name, value, f.Value.Type(), f.Name, err)
}
