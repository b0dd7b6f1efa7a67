package realomni_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/realomni"
)

// fakeGo answers `go version` and, for `go build -trimpath -o DIR/ tool`, records the call, says so on the
// started FIFO, waits for a line on the release FIFO and writes omni and omnictl into DIR.
const fakeGo = `#!/bin/sh
set -e
case "$1" in
version) echo "go version go0.0-fake linux/amd64" ;;
build)
	[ "$2" = -trimpath ] && [ "$3" = -o ] && [ "$5" = tool ] || { echo "unexpected: $*" >&2; exit 2; }
	[ -f go.mod ] || { echo "not in the wrapper module" >&2; exit 2; }
	echo build >> "$CALLS"
	echo started > "$STARTED"
	read line < "$RELEASE"
	printf '#!/bin/sh\n' > "$4omni"; printf '#!/bin/sh\n' > "$4omnictl"; chmod +x "$4omni" "$4omnictl" ;;
*) echo "unexpected: $*" >&2; exit 2 ;;
esac
`

// TestBuildCacheAndLock: two concurrent builds build once (the second waits for the lock, then finds the
// cache), a later one builds nothing, and another go.sum is another cache entry.
func TestBuildCacheAndLock(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "repo")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "hack", "omni"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "hack", "omni", "go.mod"), []byte("module x\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "hack", "omni", "go.sum"), []byte("a\n"), 0o644))

	goCmd := filepath.Join(dir, "go")
	require.NoError(t, os.WriteFile(goCmd, []byte(fakeGo), 0o755))

	calls, started, release := filepath.Join(dir, "calls"), filepath.Join(dir, "started"), filepath.Join(dir, "release")
	require.NoError(t, syscall.Mkfifo(started, 0o600))
	require.NoError(t, syscall.Mkfifo(release, 0o600))
	t.Setenv("CALLS", calls)
	t.Setenv("STARTED", started)
	t.Setenv("RELEASE", release)

	waiting := make(chan struct{})
	hook := zap.Hooks(func(e zapcore.Entry) error {
		if strings.HasPrefix(e.Message, "waiting for another build") {
			close(waiting)
		}

		return nil
	})

	opts := realomni.BuildOptions{RepoRoot: root, OutDir: filepath.Join(dir, "out"), Go: goCmd, Logger: zaptest.NewLogger(t)}

	type result struct {
		bins realomni.Binaries
		err  error
	}

	first, second := make(chan result, 1), make(chan result, 1)

	go func() {
		b, err := realomni.Build(t.Context(), opts)
		first <- result{b, err}
	}()

	b, err := os.ReadFile(started) // blocks until the first build runs
	require.NoError(t, err)
	require.Equal(t, "started\n", string(b))

	opts2 := opts
	opts2.Logger = zaptest.NewLogger(t, zaptest.WrapOptions(hook))

	go func() {
		b, err := realomni.Build(t.Context(), opts2)
		second <- result{b, err}
	}()

	<-waiting // the second build waits for the lock
	require.NoError(t, os.WriteFile(release, []byte("go\n"), 0o600))

	r1, r2 := <-first, <-second
	require.NoError(t, r1.err)
	require.NoError(t, r2.err)
	require.Equal(t, r1.bins, r2.bins)
	require.Equal(t, filepath.Join(opts.OutDir, filepath.Base(filepath.Dir(r1.bins.Omni)), "omnictl"), r1.bins.Omnictl)
	require.FileExists(t, r1.bins.Omni)

	again, err := realomni.Build(t.Context(), opts)
	require.NoError(t, err)
	require.Equal(t, r1.bins, again, "a warm cache builds nothing")

	n, err := os.ReadFile(calls)
	require.NoError(t, err)
	require.Equal(t, "build\n", string(n), "one build for three calls")

	entries, err := os.ReadDir(opts.OutDir)
	require.NoError(t, err)

	for _, e := range entries {
		require.NotContains(t, e.Name(), ".build-", "the temporary build directory is gone")
	}

	// Another go.sum is another key.
	require.NoError(t, os.WriteFile(filepath.Join(root, "hack", "omni", "go.sum"), []byte("b\n"), 0o644))

	go func() {
		b, err := realomni.Build(t.Context(), opts)
		first <- result{b, err}
	}()

	_, err = os.ReadFile(started)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(release, []byte("go\n"), 0o600))

	r3 := <-first
	require.NoError(t, r3.err)
	require.NotEqual(t, r1.bins.Omni, r3.bins.Omni)
}

// TestBuildRemovesKilledBuilds: a build's scratch directory left by a build that was killed is removed by
// the next build, the cache entries stay.
func TestBuildRemovesKilledBuilds(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "repo")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "hack", "omni"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "hack", "omni", "go.mod"), []byte("module x\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "hack", "omni", "go.sum"), []byte("a\n"), 0o644))

	goCmd := filepath.Join(dir, "go")
	require.NoError(t, os.WriteFile(goCmd, []byte(fakeGo), 0o755))

	release := filepath.Join(dir, "release") // a file: the fake build goes on at once
	require.NoError(t, os.WriteFile(release, []byte("go\n"), 0o600))
	t.Setenv("CALLS", filepath.Join(dir, "calls"))
	t.Setenv("STARTED", filepath.Join(dir, "started"))
	t.Setenv("RELEASE", release)

	out := filepath.Join(dir, "out")
	killed := filepath.Join(out, "0123456789ab.build-42")
	other := filepath.Join(out, "ba9876543210")

	require.NoError(t, os.MkdirAll(killed, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(killed, "omni"), make([]byte, 1000), 0o755))
	require.NoError(t, os.MkdirAll(other, 0o755))

	bins, err := realomni.Build(t.Context(), realomni.BuildOptions{RepoRoot: root, OutDir: out, Go: goCmd, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	require.FileExists(t, bins.Omni)
	require.NoDirExists(t, killed, "the killed build's directory is still there")
	require.DirExists(t, other, "another cache entry went")
}
