package realomni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Version is the Omni release hack/omni builds.
const Version = "v1.9.3"

// modulePath is the main module's path; the repository root is the directory of the go.mod declaring it.
const modulePath = "github.com/outpost-metal/outpost"

// noSumDB lists the module prefixes the checksum database has no entries for (Omni's own and two forks it
// replaces to); only a build that has to resolve modules missing from hack/omni/go.sum needs it.
const noSumDB = "github.com/siderolabs/*,github.com/cosi-project/*,github.com/unix4ever/*"

// lockPoll is how often a build waiting for another one retries the lock.
const lockPoll = 500 * time.Millisecond

// Binaries are the paths of a built omni server and omnictl.
type Binaries struct {
	Omni    string
	Omnictl string
}

// complete reports whether both binaries are present (each is renamed into place only once fully written).
func (b Binaries) complete() bool {
	for _, p := range []string{b.Omni, b.Omnictl} {
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 || fi.Mode()&0o111 == 0 {
			return false
		}
	}

	return true
}

// BuildOptions say where to build Omni from and to.
type BuildOptions struct {
	// RepoRoot is the repository root (holding hack/omni); empty: found by walking up from the working
	// directory to the go.mod of github.com/outpost-metal/outpost.
	RepoRoot string
	// OutDir holds the cache (<OutDir>/<key>/omni, omnictl); empty: <RepoRoot>/_out/omni.
	OutDir string
	// Go is the go command; empty: "go" from PATH.
	Go string
	// Logger gets the progress lines (a cold build takes minutes); nil: none.
	Logger *zap.Logger
}

// Default fills the empty fields.
func (o *BuildOptions) Default() error {
	if o.RepoRoot == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("working directory: %w", err)
		}

		root, err := findRepoRoot(wd)
		if err != nil {
			return err
		}

		o.RepoRoot = root
	}

	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.RepoRoot, "_out", "omni")
	}

	if o.Go == "" {
		o.Go = "go"
	}

	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}

	return nil
}

// findRepoRoot walks up from dir to the directory whose go.mod declares the main module.
func findRepoRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if strings.TrimSpace(first) == "module "+modulePath {
				return d, nil
			}
		}

		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find the repository root (go.mod of %s) above %s: not found", modulePath, dir)
		}
	}
}

// Build returns omni and omnictl built from hack/omni, from the cache under OutDir when it holds them for
// the current hack/omni/go.mod, go.sum and Go version, and otherwise builds them (minutes when cold) under a
// file lock, so concurrent callers (test packages run in parallel) build once and the others wait.
func Build(ctx context.Context, opts BuildOptions) (Binaries, error) {
	if err := opts.Default(); err != nil {
		return Binaries{}, err
	}

	log := opts.Logger.With(zap.String("component", "realomni_build"))
	modDir := filepath.Join(opts.RepoRoot, "hack", "omni")

	key, err := cacheKey(ctx, opts.Go, modDir)
	if err != nil {
		return Binaries{}, err
	}

	dir := filepath.Join(opts.OutDir, key)
	bins := Binaries{Omni: filepath.Join(dir, "omni"), Omnictl: filepath.Join(dir, "omnictl")}

	if bins.complete() {
		log.Debug("real omni from the cache", zap.String("dir", dir))

		return bins, nil
	}

	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("create omni build directory: %w", err)
	}

	unlock, err := lock(ctx, filepath.Join(opts.OutDir, ".build.lock"), log)
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()

	if bins.complete() { // built by whoever held the lock
		log.Info("real omni built by a concurrent build", zap.String("dir", dir))

		return bins, nil
	}

	// A build killed before it removed its scratch directory left it (the binaries, ~200 MB): under the lock
	// no build runs, so every one there is stale.
	stale, _ := filepath.Glob(filepath.Join(opts.OutDir, "*.build-*")) //nolint:errcheck // the pattern is valid
	for _, d := range stale {
		if err := os.RemoveAll(d); err != nil {
			return Binaries{}, fmt.Errorf("remove a killed omni build's directory: %w", err)
		}
	}

	if err := build(ctx, opts, modDir, dir, log); err != nil {
		return Binaries{}, err
	}

	return bins, nil
}

// cacheKey is a short hash of hack/omni's go.mod and go.sum and of `go version`.
func cacheKey(ctx context.Context, goCmd, modDir string) (string, error) {
	h := sha256.New()

	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(modDir, name))
		if err != nil {
			return "", fmt.Errorf("read omni wrapper module: %w", err)
		}

		h.Write(b)
		h.Write([]byte{0})
	}

	v, err := exec.CommandContext(ctx, goCmd, "version").Output()
	if err != nil {
		return "", fmt.Errorf("go version: %w", err)
	}

	h.Write(v)

	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// lock takes an exclusive flock on path, polling so that ctx can end the wait; the returned func releases it.
func lock(ctx context.Context, path string, log *zap.Logger) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open omni build lock: %w", err)
	}

	ticker := time.NewTicker(lockPoll)
	defer ticker.Stop()

	for waiting := false; ; waiting = true {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil //nolint:errcheck // closing releases the lock
		}

		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close() //nolint:errcheck

			return nil, fmt.Errorf("lock %s: %w", path, err)
		}

		if !waiting {
			log.Info("waiting for another build of a real Omni to finish", zap.String("lock", path))
		}

		select {
		case <-ctx.Done():
			f.Close() //nolint:errcheck

			return nil, fmt.Errorf("wait for the omni build lock: %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

// build runs `go build -trimpath -o <tmp>/ tool` in hack/omni and renames the binaries into dir.
func build(ctx context.Context, opts BuildOptions, modDir, dir string, log *zap.Logger) error {
	tmp, err := os.MkdirTemp(opts.OutDir, filepath.Base(dir)+".build-")
	if err != nil {
		return fmt.Errorf("create omni build directory: %w", err)
	}
	defer os.RemoveAll(tmp) //nolint:errcheck

	log.Info("building a real Omni " + Version + " from the module proxy, cold ~13 min, warm (Go build cache) ~30 s")

	start := time.Now()

	var out bytes.Buffer

	cmd := exec.CommandContext(ctx, opts.Go, "build", "-trimpath", "-o", tmp+string(filepath.Separator), "tool")
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "GONOSUMDB="+noSumDB)
	cmd.Stdout, cmd.Stderr = &out, &out

	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build omni in %s: %w: %s", modDir, err, tail(out.Bytes(), 4096))
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create omni cache directory: %w", err)
	}

	for _, name := range []string{"omnictl", "omni"} { // omni last: its presence marks the directory complete
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("move %s into the cache: %w", name, err)
		}
	}

	log.Info("built a real Omni "+Version, zap.Duration("elapsed", time.Since(start).Round(time.Second)), zap.String("dir", dir))

	return nil
}

// tail is the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}

	return string(b)
}
