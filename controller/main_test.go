package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/envflag"
)

func lookupIn(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// Every flag of every command has its variable, named after the flag, listed in its help, except those marked
// command line only (site set's, which share names with the controller's own).
func TestEveryFlagHasItsVariable(t *testing.T) {
	t.Parallel()

	root, _ := rootCommand(lookupIn(nil))

	var walk func(*cobra.Command)

	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			want := "OUTPOST_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
			if envflag.IsCommandLineOnly(f) {
				require.NotContains(t, f.Usage, "[OUTPOST_", "--%s of %q", f.Name, c.CommandPath())

				return
			}

			require.Contains(t, f.Usage, "["+want, "--%s of %q", f.Name, c.CommandPath())
		})

		for _, sub := range c.Commands() {
			walk(sub)
		}
	}

	walk(root)
}

// The controller's variables never reach site set: OUTPOST_WIPE_METHOD in an operator's shell does not change
// a site's wipe method behind the operator's back (site set without flags still says there is nothing to set).
func TestSiteSetTakesNoVariables(t *testing.T) {
	t.Parallel()

	root, _ := rootCommand(lookupIn(map[string]string{
		"OUTPOST_WIPE_METHOD": "zeroes", "OUTPOST_DISCOVERY": "off", "OUTPOST_BMC_PROTOCOL": "ipmi",
		"OUTPOST_ADMIN_SOCKET": filepath.Join(t.TempDir(), "none.sock"),
	}))
	root.SetArgs([]string{"site", "set", "branch-1"})
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)

	err := root.Execute()
	require.ErrorContains(t, err, "nothing to set")
}

// Variables reach the commands, the persistent flags of the root through a subcommand too; a variable that
// does not parse or two that disagree stop the command before it runs, naming the variables.
func TestVariablesReachTheCommands(t *testing.T) {
	t.Parallel()

	socket := filepath.Join(t.TempDir(), "nothing-here.sock")

	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{
			name: "a root persistent flag in a subcommand",
			args: []string{"site", "list"},
			env:  map[string]string{"OUTPOST_ADMIN_SOCKET": socket},
			want: socket,
		},
		{
			name: "a value that does not parse",
			env:  map[string]string{"OUTPOST_WIPE_TIMEOUT": "soon", "OUTPOST_UPLINK_MAX_SOURCES": "many"},
			want: `environment variable OUTPOST_WIPE_TIMEOUT="soon" is not a valid duration for --wipe-timeout`,
		},
		{
			name: "an alias that disagrees",
			env:  map[string]string{"OMNI_ENDPOINT": "https://a.example", "OUTPOST_OMNI_ENDPOINT": "https://b.example"},
			want: "environment variables OUTPOST_OMNI_ENDPOINT and OMNI_ENDPOINT both set --omni-endpoint, to different values",
		},
		{
			name: "a subcommand's own flag",
			args: []string{"site", "create", "branch-1"},
			env:  map[string]string{"OUTPOST_TOKEN_TTL": "forever"},
			want: `environment variable OUTPOST_TOKEN_TTL="forever" is not a valid duration for --token-ttl`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			root, _ := rootCommand(lookupIn(tc.env))
			root.SetArgs(tc.args)
			root.SetOut(&strings.Builder{})
			root.SetErr(&strings.Builder{})

			require.ErrorContains(t, root.ExecuteContext(t.Context()), tc.want)
		})
	}
}

// The README's table of flags and variables is the one the controller binds.
func TestReadmeListsEveryVariable(t *testing.T) {
	t.Parallel()

	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)

	start := strings.Index(string(readme), "<!-- controller flags -->")
	end := strings.Index(string(readme), "<!-- end controller flags -->")
	require.True(t, start >= 0 && end > start, "README has the controller flags table between its markers")

	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| ([^|]+) \\|")
	documented := map[string][]string{}

	for _, m := range row.FindAllStringSubmatch(string(readme)[start:end], -1) {
		var vars []string
		for _, v := range strings.Split(m[2], ",") {
			vars = append(vars, strings.Trim(strings.TrimSpace(v), "`"))
		}

		documented[m[1]] = vars
	}

	_, binding := rootCommand(lookupIn(nil))
	bound := binding.Vars()

	var table []string

	names := make([]string, 0, len(bound))
	for name := range bound {
		names = append(names, name)
	}

	slices.Sort(names)

	for _, name := range names {
		table = append(table, "| `--"+name+"` | `"+strings.Join(bound[name], "`, `")+"` |")
	}

	require.Equal(t, bound, documented, "README rows should be:\n%s", strings.Join(table, "\n"))
}
