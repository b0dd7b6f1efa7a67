// Package tmpcheck gives a lab test binary a temporary directory of its own and fails the run when its tests
// leave anything there: what the lab's tests write belongs under _out/ or in a directory they remove
// (t.TempDir). A test package wires it in its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(tmpcheck.Wrap(m).Run()) }
package tmpcheck

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Runner runs a test binary's tests and returns its exit code (*testing.M, and what goleak.VerifyTestMain
// takes).
type Runner interface {
	Run() int
}

// Wrap returns m run with TMPDIR (hence os.TempDir, t.TempDir and every program the tests start) set to a
// fresh directory in the system's temporary directory. When m's tests are done, what is left there is
// listed on stderr and fails the run (exit code 1); the directory is removed either way. In a fuzzing run
// (-test.fuzz, its workers) m runs as it is: the workers share the coordinator's directory while they run.
func Wrap(m Runner) Runner { return wrapped{m: m, stderr: os.Stderr, args: os.Args} }

type wrapped struct {
	m      Runner
	stderr io.Writer
	args   []string
}

func (w wrapped) Run() int {
	for _, a := range w.args {
		if strings.HasPrefix(a, "-test.fuzz") {
			return w.m.Run()
		}
	}

	dir, err := shortTempDir()
	if err != nil {
		fmt.Fprintf(w.stderr, "tmpcheck: a temporary directory for the tests: %v\n", err) //nolint:errcheck

		return 1
	}

	defer os.RemoveAll(dir) //nolint:errcheck // best effort; a failure is reported below

	prev, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", dir) //nolint:errcheck // a valid name and value

	code := w.m.Run()

	if had {
		os.Setenv("TMPDIR", prev) //nolint:errcheck
	} else {
		os.Unsetenv("TMPDIR") //nolint:errcheck
	}

	left, err := Leftovers(dir, maxListed)
	if err != nil {
		fmt.Fprintf(w.stderr, "tmpcheck: %v\n", err) //nolint:errcheck

		return 1
	}

	if len(left) > 0 {
		fmt.Fprintf(w.stderr, "tmpcheck: FAIL: the tests left %d entries in their temporary directory (os.TempDir, "+ //nolint:errcheck
			"removed now); what they write belongs under _out/ or in a directory they remove:\n  %s\n",
			len(left), strings.Join(left, "\n  "))

		if code == 0 {
			code = 1
		}
	}

	return code
}

// shortTempDir creates a directory in the system's temporary directory with a name as short as it can be
// ("ot" and four hex digits, where os.MkdirTemp adds ten): tests put unix sockets under t.TempDir, whose
// paths must stay under 108 bytes (sun_path) with the test's name in them.
func shortTempDir() (string, error) {
	var err error

	for range 100 {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("ot%04x", rand.IntN(1<<16))) // a name, not a secret

		if err = os.Mkdir(dir, 0o700); err == nil {
			return dir, nil
		}

		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}

	return "", fmt.Errorf("create a temporary directory: %w", err)
}

// maxListed is how many leftovers a failure names.
const maxListed = 20

// Leftovers lists the top-level entries of dir with their sizes (a directory's is the sum of its regular
// files), sorted by name, at most limit of them and then a line saying how many more there are.
func Leftovers(dir string, limit int) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}

	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}

	sort.Strings(names)

	var out []string

	for i, name := range names {
		if i == limit {
			out = append(out, fmt.Sprintf("... and %d more", len(names)-limit))

			break
		}

		out = append(out, fmt.Sprintf("%s (%d bytes)", name, size(filepath.Join(dir, name))))
	}

	return out, nil
}

// size is the sum of the sizes of the regular files under path (path itself when it is one).
func size(path string) int64 {
	var n int64

	filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error { //nolint:errcheck // a partial sum is enough
		if err != nil {
			return nil // unreadable parts are left out of the sum
		}

		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}

		return nil
	})

	return n
}
