// Package envflag gives command-line flags their environment-variable fallbacks. Bind (bind.go) is the way
// for a binary's flags: it walks the flag sets once, names every flag's variable after the flag, lists the
// variables in --help, and applies them after parsing, so no flag can be without one. Env below reads single
// variables as flag defaults, for tools that name their variables one by one; with either, a variable that
// does not parse is an error, not a silent default.
package envflag

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Env reads flag defaults from the environment and remembers the variables that did not parse.
type Env struct {
	lookup func(string) (string, bool)
	errs   []error
}

// New reads the process environment.
func New() *Env { return &Env{lookup: os.LookupEnv} }

// String returns the variable's value, or def when it is unset.
func (e *Env) String(name, def string) string {
	if v, ok := e.lookup(name); ok {
		return v
	}

	return def
}

// Duration returns the variable as a duration (e.g. "90s"), or def when it is unset.
func (e *Env) Duration(name string, def time.Duration) time.Duration {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}

	d, err := time.ParseDuration(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not a duration", name, v))

		return def
	}

	return d
}

// Int returns the variable as a decimal integer, or def when it is unset.
func (e *Env) Int(name string, def int) int {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}

	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not an integer", name, v))

		return def
	}

	return n
}

// Bool returns the variable as a boolean, or def when it is unset.
func (e *Env) Bool(name string, def bool) bool {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}

	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not a boolean", name, v))

		return def
	}

	return b
}

// Err returns every variable that did not parse, or nil.
func (e *Env) Err() error { return errors.Join(e.errs...) }
