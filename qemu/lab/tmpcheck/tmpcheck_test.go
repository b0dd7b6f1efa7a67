package tmpcheck_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/lab/tmpcheck"
)

// runner is a test binary whose tests do what fn does and return code.
type runner struct {
	fn   func() error
	code int
	dir  string // the temporary directory the tests saw
	err  error
}

func (r *runner) Run() int {
	r.dir = os.TempDir()
	r.err = r.fn()

	return r.code
}

// TestWrap checks each outcome: nothing left passes, a file or a directory left fails the run and is named
// with its size, a failing run keeps its own code; the private directory is gone after the run and TMPDIR
// is what it was.
func TestWrap(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())

	before := os.TempDir()

	for _, tc := range []struct {
		name     string
		fn       func(dir string) error
		code     int
		wantCode int
		wantLeft []string
	}{
		{name: "clean", fn: func(string) error { return nil }, wantCode: 0},
		{
			name: "removed its own directory",
			fn: func(string) error {
				d, err := os.MkdirTemp("", "x-")
				if err != nil {
					return err
				}

				return os.RemoveAll(d)
			},
			wantCode: 0,
		},
		{
			name:     "left a file",
			fn:       func(dir string) error { return os.WriteFile(filepath.Join(dir, "binary"), make([]byte, 1234), 0o600) },
			wantCode: 1,
			wantLeft: []string{"1 entries", "binary (1234 bytes)"},
		},
		{
			name: "left a directory",
			fn: func(dir string) error {
				if err := os.MkdirAll(filepath.Join(dir, "bins", "sub"), 0o700); err != nil {
					return err
				}

				return os.WriteFile(filepath.Join(dir, "bins", "sub", "edge"), make([]byte, 10), 0o600)
			},
			wantCode: 1,
			wantLeft: []string{"bins (10 bytes)"},
		},
		{name: "failing tests keep their code", fn: func(string) error { return nil }, code: 3, wantCode: 3},
		{
			name:     "failing tests that left something keep their code",
			fn:       func(dir string) error { return os.WriteFile(filepath.Join(dir, "f"), nil, 0o600) },
			code:     2,
			wantCode: 2,
			wantLeft: []string{"f (0 bytes)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{code: tc.code}
			r.fn = func() error { return tc.fn(r.dir) }

			var stderr bytes.Buffer

			code := tmpcheck.WrapWith(r, &stderr, []string{"pkg.test", "-test.v"}).Run()

			require.NoError(t, r.err)
			require.Equal(t, tc.wantCode, code, stderr.String())
			require.NotEqual(t, before, r.dir, "the tests ran in the system's temporary directory")
			require.Equal(t, before, filepath.Dir(r.dir), "the private directory is not in the temporary directory")
			require.NoDirExists(t, r.dir, "the private directory was not removed")
			require.Equal(t, before, os.TempDir(), "TMPDIR not restored")

			if len(tc.wantLeft) == 0 {
				require.Empty(t, stderr.String())
			}

			for _, w := range tc.wantLeft {
				require.Contains(t, stderr.String(), w)
			}
		})
	}
}

// TestWrapFuzzing checks that a fuzzing run (coordinator or worker) runs in the temporary directory it was
// given.
func TestWrapFuzzing(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())

	for _, arg := range []string{"-test.fuzz=FuzzX", "-test.fuzzworker"} {
		r := &runner{fn: func() error { return nil }}

		require.Equal(t, 0, tmpcheck.WrapWith(r, os.Stderr, []string{"pkg.test", arg}).Run())
		require.Equal(t, os.TempDir(), r.dir, arg)
	}
}

// TestLeftoversBounded checks that a directory full of leftovers is named in a bounded list.
func TestLeftoversBounded(t *testing.T) {
	dir := t.TempDir()

	for i := range 30 {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), []byte("ab"), 0o600))
	}

	left, err := tmpcheck.Leftovers(dir, 5)
	require.NoError(t, err)
	require.Equal(t, []string{"f00 (2 bytes)", "f01 (2 bytes)", "f02 (2 bytes)", "f03 (2 bytes)", "f04 (2 bytes)", "... and 25 more"}, left)

	_, err = tmpcheck.Leftovers(filepath.Join(dir, "missing"), 5)
	require.ErrorContains(t, err, "missing")
	require.False(t, strings.Contains(err.Error(), "\n"))
}
