package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Release is a release of Outpost in the repository's own history: the commit it was built from and the
// version its binaries report.
type Release struct {
	Commit, Version string
}

// PreviousRelease is the release before the one this tree is (shared/version/CHANGELOG.md's newest heading).
//
// v0.1.0 and v0.2.0 (the first two waves of work) were never tagged, and a CI clone may not carry tags at all,
// so the commit is named here rather than looked up. 389ebc4 is the last commit of v0.2.0: the tree issue 29
// (releases, and an edge one version behind) started from. It already has the linker-stamped version
// (shared/version.stamped), so its edge reports v0.2.0 as a release build of it would have. When the release
// after v0.3.0 is cut, this becomes v0.3.0's tagged commit.
var PreviousRelease = Release{Commit: "389ebc41f882cfd5d5259450ea475a49378e4507", Version: "v0.2.0"}

// stampedVar is the variable a release build sets with -ldflags -X.
const stampedVar = "github.com/outpost-metal/outpost/shared/version.stamped"

// BuildStamped builds a package of the module at root into out as a release build reporting version.
func BuildStamped(ctx context.Context, root, pkg, version, out string) error {
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X '"+stampedVar+"="+version+"'", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")

	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s (version %s) in %s: %w\n%s", pkg, version, root, err, b)
	}

	return nil
}

// BuildAt builds a package of the repository at root as it was at commit, reporting version, and returns the
// binary's path. The commit's tree is taken with `git archive <commit> | tar -x` into
// root/_out/releases/<commit>/src once; binaries are kept beside it by package and version, so a second run
// builds nothing.
func BuildAt(ctx context.Context, root, commit, pkg, version string) (string, error) {
	dir := filepath.Join(root, "_out", "releases", commit)
	src := filepath.Join(dir, "src")
	out := filepath.Join(dir, filepath.Base(pkg)+"-"+strings.NewReplacer("/", "_", " ", "_", "'", "_").Replace(version))

	if _, err := os.Stat(out); err == nil {
		return out, nil
	}

	if err := extract(ctx, root, commit, src); err != nil {
		return "", err
	}

	// A commit without the variable would build, but its binaries could not report a release.
	v, err := os.ReadFile(filepath.Join(src, "shared", "version", "version.go"))
	if err != nil || !bytes.Contains(v, []byte("\nvar stamped string")) {
		return "", fmt.Errorf("commit %s has no linker-stamped version (shared/version.stamped): its binaries cannot report %s", commit, version)
	}

	if err := BuildStamped(ctx, src, pkg, version, out+".tmp"); err != nil {
		return "", err
	}

	return out, os.Rename(out+".tmp", out)
}

// extract writes the tree of commit to dst unless it is there (a complete extraction is renamed into place).
func extract(ctx context.Context, root, commit, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}

	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}

	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}

	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", tmp)

	var archiveErr, untarErr bytes.Buffer

	archive.Stderr, untar.Stderr = &archiveErr, &untarErr

	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}

	untar.Stdin = pipe

	if err := archive.Start(); err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}

	if err := untar.Run(); err != nil {
		_ = archive.Wait() // its own error, if any, is the lesser one

		return fmt.Errorf("git archive %s | tar -x: %w: %s", commit, err, untarErr.Bytes())
	}

	if err := archive.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, archiveErr.Bytes())
	}

	return os.Rename(tmp, dst)
}
