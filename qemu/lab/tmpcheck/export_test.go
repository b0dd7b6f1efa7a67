package tmpcheck

import "io"

// WrapWith is Wrap with the run's stderr and arguments given.
func WrapWith(m Runner, stderr io.Writer, args []string) Runner {
	return wrapped{m: m, stderr: stderr, args: args}
}
