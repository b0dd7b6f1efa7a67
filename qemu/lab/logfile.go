package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// LogFile is a log another process writes (a process's output, a QEMU serial console), read by polling.
type LogFile struct {
	Path string
}

// Size returns the current length; pass it as from to look only at what is written afterwards.
func (f *LogFile) Size() int64 {
	st, err := os.Stat(f.Path)
	if err != nil {
		return 0
	}

	return st.Size()
}

// Since returns what was written from offset on.
func (f *LogFile) Since(from int64) []byte {
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil
	}
	defer fh.Close() //nolint:errcheck

	if _, err := fh.Seek(from, io.SeekStart); err != nil {
		return nil
	}

	b, _ := io.ReadAll(fh) //nolint:errcheck

	return b
}

// Contains reports whether needle was written at or after offset from.
func (f *LogFile) Contains(from int64, needle string) bool {
	return bytes.Contains(f.Since(from), []byte(needle))
}

// Tail returns the last n bytes.
func (f *LogFile) Tail(n int64) string {
	from := max(f.Size()-n, 0)

	return string(f.Since(from))
}

// ErrFailMarker is wrapped when WaitFor sees one of its failure markers.
var ErrFailMarker = fmt.Errorf("failure marker in log")

// WaitFor polls until needle appears after from, returning early with ErrFailMarker when one of fail appears
// there first, and with an error at the timeout or when ctx ends.
func (f *LogFile) WaitFor(ctx context.Context, from int64, needle string, timeout time.Duration, fail ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	for {
		b := f.Since(from)
		if bytes.Contains(b, []byte(needle)) {
			return nil
		}

		for _, m := range fail {
			if bytes.Contains(b, []byte(m)) {
				return fmt.Errorf("%w: %q while waiting for %q in %s; tail:\n%s", ErrFailMarker, m, needle, f.Path, f.Tail(3000))
			}
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("no %q in %s within %s; tail:\n%s", needle, f.Path, timeout, f.Tail(3000))
		case <-time.After(150 * time.Millisecond):
		}
	}
}
