package lab

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// VMediaLoader builds (or finds cached) the boot loader of the edge's virtual-media images with
// hack/vmedia-loader.sh (Debian's grub-efi-amd64-bin) and returns its path; the error says what is missing.
func VMediaLoader(ctx context.Context, root string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "vmedia-loader.sh")).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // the process's own error carries its stderr
			stderr = strings.TrimSpace(string(ee.Stderr))
		}

		return "", fmt.Errorf("vmedia loader: %w: %s", err, stderr)
	}

	return strings.TrimSpace(string(out)), nil
}

// AcceptAndSettle accepts a pending machine in Omni and waits until it is ready (BMC user provisioned through
// its agent, disk wiped) and settled (off with the stand-in, kept on with a real Omni).
func (e *Env) AcceptAndSettle(ctx context.Context, m *Machine) error {
	if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
		return err
	}

	return e.waitSettled(ctx, m)
}
