package lab

import (
	"context"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// VMediaLoader builds (or finds cached) the boot loader of the edge's virtual-media images with
// hack/vmedia-loader.sh (Debian's grub-efi-amd64-bin) and returns its path; the error says what is missing.
func VMediaLoader(ctx context.Context, root string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	return bootlab.Hack(ctx, root, "vmedia-loader.sh")
}

// AcceptAndSettle accepts a pending machine in Omni and waits until it is ready (BMC user provisioned through
// its agent, disk wiped) and settled (off with the stand-in, kept on with a real Omni).
func (e *Env) AcceptAndSettle(ctx context.Context, m *Machine) error {
	if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
		return err
	}

	return e.waitSettled(ctx, m)
}
