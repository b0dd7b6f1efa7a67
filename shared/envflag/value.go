package envflag

import "github.com/spf13/pflag"

// Parsed is *p as a flag value (pflag.Value) that holds what parse makes of the flag's text, so that a
// configuration holds the parsed value, never the text, and a bad value is refused when flags are parsed. kind
// names the value in help text; format prints it back.
func Parsed[T any](p *T, kind string, parse func(string) (T, error), format func(T) string) pflag.Value {
	return &parsed[T]{p: p, kind: kind, parse: parse, format: format}
}

type parsed[T any] struct {
	p      *T
	kind   string
	parse  func(string) (T, error)
	format func(T) string
}

func (v *parsed[T]) String() string {
	if v.p == nil {
		return ""
	}

	return v.format(*v.p)
}

func (v *parsed[T]) Set(s string) error {
	t, err := v.parse(s)
	if err != nil {
		return err
	}

	*v.p = t

	return nil
}

func (v *parsed[T]) Type() string { return v.kind }
