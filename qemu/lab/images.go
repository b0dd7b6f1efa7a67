package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// Images are the machine-side boot files: Debian's cloud kernel and the initramfs whose /init is
// qemu/labinit. The same pair serves agent mode and the lab's "Talos installer" (install mode is told apart by
// the kernel command line).
type Images struct {
	Kernel    string
	Initramfs string
	// AssetsDir holds them as agent/x86_64/vmlinuz and agent/x86_64/initramfs.xz, the edge's default
	// agent-mode paths, plus install/x86_64/... for the install plan.
	AssetsDir string
}

// InitModules are the kernel modules the lab machine's /init loads: the virtio NIC, disk and entropy source (without
// it the guest's random pool takes minutes to initialise under TCG and every crypto/rand call blocks).
var InitModules = []string{"virtio_pci", "virtio_net", "virtio_blk", "virtio_rng"}

// GoBuild builds a package of the module at root statically into out.
func GoBuild(ctx context.Context, root, pkg, out string) error {
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")

	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}

	return nil
}

// goTool finds the go command: on PATH (go test and go run put their own first), else under GOROOT.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}

	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}

	return "go"
}

// BuildImages fetches the kernel (cached under root/_out/bootlab, shared with the boot lab; wraps
// bootlab.ErrNoKernel when it cannot be had) and builds the initramfs into dir.
func BuildImages(ctx context.Context, root, dir string) (Images, error) {
	kernel, err := bootlab.EnsureKernel(filepath.Join(root, "_out", "bootlab"))
	if err != nil {
		return Images{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	initBin := filepath.Join(dir, "labinit")
	if err := GoBuild(ctx, root, "./qemu/labinit", initBin); err != nil {
		return Images{}, err
	}

	initData, err := os.ReadFile(initBin)
	if err != nil {
		return Images{}, err
	}

	img := Images{AssetsDir: filepath.Join(dir, "assets")}

	for _, sub := range []string{"agent", "install"} {
		d := filepath.Join(img.AssetsDir, sub, "x86_64")
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Images{}, err
		}

		if err := copyFile(kernel.Vmlinuz, filepath.Join(d, "vmlinuz")); err != nil {
			return Images{}, err
		}

		f, err := os.Create(filepath.Join(d, "initramfs.xz"))
		if err != nil {
			return Images{}, err
		}

		if err := bootlab.BuildInitramfs(f, initData, kernel.ModulesDir, InitModules); err != nil {
			f.Close() //nolint:errcheck

			return Images{}, fmt.Errorf("build initramfs: %w", err)
		}

		if err := f.Close(); err != nil {
			return Images{}, err
		}
	}

	img.Kernel = filepath.Join(img.AssetsDir, "agent", "x86_64", "vmlinuz")
	img.Initramfs = filepath.Join(img.AssetsDir, "agent", "x86_64", "initramfs.xz")

	return img, nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}

	return os.WriteFile(dst, b, 0o644)
}
