// Package metalagent builds the real Talos metal agent (github.com/siderolabs/talos-metal-agent, the agent
// Omni's bare-metal provider drives) from the Go module proxy through the wrapper module hack/metalagent, and
// caches the static binary under _out/metalagent keyed by the agent's version, the wrapper's go.mod and go.sum
// and the Go version. The lab puts it into its machines' initramfs. It is test tooling.
package metalagent

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

// Version is the agent release hack/metalagent builds.
const Version = "v0.1.6"

// Command is the agent's command package (built as the wrapper module's tool).
const Command = "github.com/siderolabs/talos-metal-agent/cmd/talos-metal-agent"

// BinaryName is the built binary's file name.
const BinaryName = "talos-metal-agent"

// modulePath is the main module's path; the repository root is the directory of the go.mod declaring it.
const modulePath = "github.com/outpost-metal/outpost"

// lockPoll is how often a build waiting for another one retries the lock.
const lockPoll = 500 * time.Millisecond

// BuildOptions say where to build the agent from and to.
type BuildOptions struct {
	// RepoRoot is the repository root (holding hack/metalagent); empty: found by walking up from the working
	// directory to the go.mod of github.com/outpost-metal/outpost.
	RepoRoot string
	// OutDir holds the cache (<OutDir>/<version>-<key>/talos-metal-agent); empty: <RepoRoot>/_out/metalagent.
	OutDir string
	// Go is the go command; empty: "go" from PATH.
	Go string
	// Logger gets the progress lines; nil: none.
	Logger *zap.Logger
}

// Default fills the empty fields.
func (o *BuildOptions) Default() error {
	if o.RepoRoot == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("working directory: %w", err)
		}

		if o.RepoRoot, err = findRepoRoot(wd); err != nil {
			return err
		}
	}

	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.RepoRoot, "_out", "metalagent")
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

// Build returns the path of a static talos-metal-agent built from hack/metalagent: from the cache when it
// holds one for the same key, otherwise built (about a minute warm, a few when the modules are cold) under a
// file lock, so concurrent callers build once and the others wait.
func Build(ctx context.Context, opts BuildOptions) (string, error) {
	if err := opts.Default(); err != nil {
		return "", err
	}

	log := opts.Logger.With(zap.String("component", "metalagent_build"))
	modDir := filepath.Join(opts.RepoRoot, "hack", "metalagent")

	key, err := cacheKey(ctx, opts.Go, modDir)
	if err != nil {
		return "", err
	}

	dir := filepath.Join(opts.OutDir, Version+"-"+key)
	bin := filepath.Join(dir, BinaryName)

	if complete(bin) {
		return bin, nil
	}

	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return "", fmt.Errorf("create agent build directory: %w", err)
	}

	unlock, err := lock(ctx, filepath.Join(opts.OutDir, ".build.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()

	if complete(bin) { // built by whoever held the lock
		return bin, nil
	}

	if err := build(ctx, opts, modDir, dir, log); err != nil {
		return "", err
	}

	return bin, nil
}

// complete reports whether the binary is in place (it is renamed there only once fully written).
func complete(path string) bool {
	fi, err := os.Stat(path)

	return err == nil && fi.Mode().IsRegular() && fi.Size() > 0 && fi.Mode()&0o111 != 0
}

// cacheKey is a short hash of hack/metalagent's go.mod and go.sum and of `go version`.
func cacheKey(ctx context.Context, goCmd, modDir string) (string, error) {
	h := sha256.New()

	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(modDir, name))
		if err != nil {
			return "", fmt.Errorf("read agent wrapper module: %w", err)
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
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open agent build lock: %w", err)
	}

	ticker := time.NewTicker(lockPoll)
	defer ticker.Stop()

	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil //nolint:errcheck // closing releases the lock
		}

		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close() //nolint:errcheck

			return nil, fmt.Errorf("lock %s: %w", path, err)
		}

		select {
		case <-ctx.Done():
			f.Close() //nolint:errcheck

			return nil, fmt.Errorf("wait for the agent build lock: %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

// build runs `go build -trimpath -ldflags "-s -w" -o <tmp>/ tool` in hack/metalagent with cgo off (a static
// binary for the guest's initramfs) and renames the binary into dir.
func build(ctx context.Context, opts BuildOptions, modDir, dir string, log *zap.Logger) error {
	tmp, err := os.MkdirTemp(opts.OutDir, filepath.Base(dir)+".build-")
	if err != nil {
		return fmt.Errorf("create agent build directory: %w", err)
	}
	defer os.RemoveAll(tmp) //nolint:errcheck

	log.Info("building the real Talos metal agent " + Version + " from the module proxy")

	start := time.Now()

	var out bytes.Buffer

	cmd := exec.CommandContext(ctx, opts.Go, "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp+string(filepath.Separator), "tool")
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = &out, &out

	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the metal agent in %s: %w: %s", modDir, err, tail(out.Bytes(), 4096))
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create agent cache directory: %w", err)
	}

	if err := os.Rename(filepath.Join(tmp, BinaryName), filepath.Join(dir, BinaryName)); err != nil {
		return fmt.Errorf("move the agent into the cache: %w", err)
	}

	log.Info("built the real Talos metal agent "+Version, zap.Duration("elapsed", time.Since(start).Round(time.Second)),
		zap.String("dir", dir))

	return nil
}

// tail is the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}

	return string(b)
}
