// Package vmedia builds the bootable images a site without DHCP boots from: a BMC mounts one over Redfish
// VirtualMedia, the machine's UEFI firmware boots it as a CD, and the image brings the machine up with its
// registered static address in agent mode or to install, the way a network boot would.
//
// An image is an ISO 9660 file system with a UEFI El Torito boot entry (go-diskfs writes both; no ISO code is
// written here). The entry is a small FAT16 EFI system partition holding only the boot loader, a standalone
// GRUB built from Debian's grub-efi-amd64-bin when the appliance is built (hack/vmedia-loader.sh). GRUB's
// embedded configuration finds the image's own file system by /outpost/boot.cfg and reads it; that file, the
// kernel and the initramfs sit on the ISO 9660 side:
//
//	/EFIBOOT.IMG          the EFI system partition (EFI/BOOT/BOOTX64.EFI = the loader)
//	/outpost/boot.cfg     linux /outpost/vmlinuz '<arg>'...; initrd /outpost/initrd; boot
//	/outpost/vmlinuz
//	/outpost/initrd
//
// Images are built on the edge from its asset cache and kept by what they hold (Store), so a machine that boots
// the same plan again gets the same file.
package vmedia

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/fat16"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/diskfs/go-diskfs/partition/mbr"
)

// Paths inside an image.
const (
	// ConfigPath is the boot loader configuration on the ISO 9660 side; the loader's embedded configuration
	// searches for it (see hack/vmedia-loader.sh).
	ConfigPath = "/outpost/boot.cfg"
	kernelPath = "/outpost/vmlinuz"
	initrdPath = "/outpost/initrd"
	espPath    = "/EFIBOOT.IMG"
	loaderPath = "/EFI/BOOT/BOOTX64.EFI"
)

// Errors for kernel arguments that cannot go into an image.
var (
	// ErrUnsafeArg means an argument holds a quote, a backslash or a control character: it would break out of
	// the boot loader's line.
	ErrUnsafeArg = errors.New("kernel argument cannot stand in the boot loader's configuration")
	// ErrArgsTooLong means the command line is over the kernel's limit.
	ErrArgsTooLong = errors.New("kernel command line too long")
)

// MaxCmdline is the x86 kernel's command line limit (COMMAND_LINE_SIZE).
const MaxCmdline = 2048

// Contents is what an image boots.
type Contents struct {
	// Kernel and Initrd are read once each.
	Kernel, Initrd io.Reader
	// Args is the kernel command line, one argument each.
	Args []string
}

// BootConfig is the GRUB configuration of an image booting args: each argument single-quoted, so GRUB expands
// nothing and the kernel gets it as written.
func BootConfig(args []string) (string, error) {
	total := 0

	for _, a := range args {
		total += len(a) + 1

		if a == "" || strings.ContainsAny(a, `'\`) || strings.ContainsFunc(a, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return "", fmt.Errorf("%w: %q", ErrUnsafeArg, a)
		}
	}

	if total > MaxCmdline {
		return "", fmt.Errorf("%w: %d bytes, at most %d", ErrArgsTooLong, total, MaxCmdline)
	}

	var b strings.Builder

	b.WriteString("set timeout=0\necho 'outpost: booting the virtual media image'\nlinux " + kernelPath)

	for _, a := range args {
		b.WriteString(" '" + a + "'")
	}

	b.WriteString("\ninitrd " + initrdPath + "\nboot\n")

	return b.String(), nil
}

// Build writes the image of c, booted by the EFI loader at loader, to out. work is a directory for the
// build's scratch files (removed before Build returns); out is written in place, so callers write to a
// temporary name and rename.
func Build(loader string, c Contents, out, work string) error {
	cfg, err := BootConfig(c.Args)
	if err != nil {
		return err
	}

	scratch, err := os.MkdirTemp(work, "vmedia-")
	if err != nil {
		return fmt.Errorf("image scratch directory: %w", err)
	}
	defer os.RemoveAll(scratch) //nolint:errcheck

	esp := filepath.Join(scratch, "efiboot.img")
	if err := buildESP(loader, esp); err != nil {
		return fmt.Errorf("efi system partition: %w", err)
	}

	f, err := os.OpenFile(out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create image: %w", err)
	}
	defer f.Close() //nolint:errcheck

	workspace := filepath.Join(scratch, "iso")
	if err := os.Mkdir(workspace, 0o755); err != nil {
		return fmt.Errorf("image workspace: %w", err)
	}

	iso, err := iso9660.Create(file.New(f, false), 0, 0, 2048, workspace)
	if err != nil {
		return fmt.Errorf("create iso 9660 file system: %w", err)
	}

	if err := iso.Mkdir("/outpost"); err != nil {
		return fmt.Errorf("image: %w", err)
	}

	espFile, err := os.Open(esp)
	if err != nil {
		return fmt.Errorf("efi system partition: %w", err)
	}
	defer espFile.Close() //nolint:errcheck

	for _, w := range []struct {
		path string
		src  io.Reader
	}{
		{ConfigPath, strings.NewReader(cfg)}, {kernelPath, c.Kernel}, {initrdPath, c.Initrd}, {espPath, espFile},
	} {
		if err := writeInto(iso.OpenFile, w.path, w.src); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	}

	if err := iso.Finalize(iso9660.FinalizeOptions{
		RockRidge:        true,
		VolumeIdentifier: "OUTPOST",
		ElTorito: &iso9660.ElTorito{
			BootCatalog: "/BOOT.CAT",
			Entries: []*iso9660.ElToritoEntry{{
				Platform: iso9660.EFI, Emulation: iso9660.NoEmulation, BootFile: espPath, SystemType: mbr.EFISystem,
			}},
		},
	}); err != nil {
		return fmt.Errorf("finalize image: %w", err)
	}

	return f.Close()
}

// espSize is the size of the EFI system partition around a loader of n bytes: at least 8 MiB so that FAT16
// holds enough clusters, and the loader with 1 MiB to spare.
func espSize(n int64) int64 {
	const mib = 1 << 20

	return max(8*mib, (n+2*mib-1)/mib*mib)
}

// buildESP writes a FAT16 file system holding the loader as the removable-media boot file.
func buildESP(loader, out string) error {
	src, err := os.Open(loader)
	if err != nil {
		return fmt.Errorf("boot loader: %w", err)
	}
	defer src.Close() //nolint:errcheck

	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("boot loader: %w", err)
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	size := espSize(st.Size())
	if err := f.Truncate(size); err != nil {
		return err
	}

	fat, err := fat16.Create(file.New(f, false), size, 0, 512, "OUTPOSTESP", true)
	if err != nil {
		return fmt.Errorf("create fat file system: %w", err)
	}

	if err := fat.Mkdir("/EFI/BOOT"); err != nil {
		return err
	}

	if err := writeInto(fat.OpenFile, loaderPath, src); err != nil {
		return err
	}

	return f.Close()
}

// writeInto copies src into a new file at path of a go-diskfs file system.
func writeInto[F io.WriteCloser](open func(string, int) (F, error), path string, src io.Reader) error {
	dst, err := open(path, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}

	if _, err := io.Copy(dst, src); err != nil {
		dst.Close() //nolint:errcheck

		return fmt.Errorf("write %s: %w", path, err)
	}

	if err := dst.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}

	return nil
}
