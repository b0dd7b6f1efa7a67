package lab_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
)

// skipUnlessLab skips unless lab tests can run here, saying why.
func skipUnlessLab(t *testing.T) {
	t.Helper()

	bootlab.SkipUnlessLab(t, "qemu-system-x86_64", "dpkg-deb", "ipmitool")

	for _, f := range []string{lab.OVMFCode, lab.OVMFVars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian ovmf)", f)
		}
	}

	if _, err := lab.IPXEDir(); err != nil {
		t.Skipf("lab test: no iPXE (%v)", err)
	}
}

// newLab creates a lab under _out/<name> (kept after the test for diagnosis) and the images.
func newLab(t *testing.T, name string) (*lab.Lab, lab.Images, string) {
	t.Helper()

	root := bootlab.RepoRoot(t)

	l, err := lab.New(filepath.Join(root, "_out", name), zapLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(l.Close)
	t.Cleanup(l.CloseOnSignal())

	images, err := lab.BuildImages(context.Background(), root, filepath.Join(l.Dir, "images"))
	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab test: %v", err)
	}

	if err != nil {
		t.Fatal(err)
	}

	return l, images, root
}

func build(t *testing.T, l *lab.Lab, root, pkg string) string {
	t.Helper()

	out := filepath.Join(l.Dir, "bin", filepath.Base(pkg))
	if err := lab.GoBuild(context.Background(), root, pkg, out); err != nil {
		t.Fatal(err)
	}

	return out
}

func ipmitool(t *testing.T, ns, host, user, password string, args ...string) (string, error) {
	t.Helper()

	full := append([]string{"netns", "exec", ns, "ipmitool", "-I", "lanplus", "-H", host, "-U", user, "-P", password}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()

	return string(out), err
}

// zapLogger logs the lab's own lines at info level and above (debug lines of every process go to their log files).
func zapLogger(t *testing.T) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
}
