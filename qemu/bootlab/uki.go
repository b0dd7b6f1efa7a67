package bootlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// UKIStub is Debian's systemd-boot EFI stub for x86 (systemd-boot-efi), the start of every lab UKI.
const UKIStub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// UKI is what goes into a unified kernel image: a kernel, an initrd (none when empty) and its command line.
type UKI struct {
	Kernel, Initrd, Cmdline string
}

// Signer signs EFI binaries with a key and its certificate (PEM); the key may be encrypted with Passphrase
// (sbsign cannot take one: it is decrypted into a scratch directory first).
type Signer struct {
	Key, Cert, Passphrase string
}

// BuildSignedUKI builds u as a unified kernel image (the stub with .osrel, .cmdline, .linux and .initrd sections
// added by objcopy) and returns it signed by s (sbsign); dir is scratch space.
func BuildSignedUKI(ctx context.Context, dir string, u UKI, s Signer) ([]byte, error) {
	work, err := os.MkdirTemp(dir, "uki-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work) //nolint:errcheck

	osrel, cmdline, unsigned, signed := filepath.Join(work, "os-release"), filepath.Join(work, "cmdline"),
		filepath.Join(work, "unsigned.efi"), filepath.Join(work, "signed.efi")

	if err := os.WriteFile(osrel, []byte("NAME=\"Outpost lab\"\nID=outpost-lab\n"), 0o644); err != nil {
		return nil, err
	}

	if err := os.WriteFile(cmdline, []byte(u.Cmdline+"\x00"), 0o644); err != nil {
		return nil, err
	}

	// The section addresses lie past the stub's own sections (tens of KiB), the kernel's below 48 MiB.
	args := []string{
		"--add-section", ".osrel=" + osrel, "--change-section-vma", ".osrel=0x20000",
		"--add-section", ".cmdline=" + cmdline, "--change-section-vma", ".cmdline=0x30000",
		"--add-section", ".linux=" + u.Kernel, "--change-section-vma", ".linux=0x2000000",
	}
	if u.Initrd != "" {
		args = append(args, "--add-section", ".initrd="+u.Initrd, "--change-section-vma", ".initrd=0x3000000")
	}

	if err := run(ctx, "objcopy", append(args, UKIStub, unsigned)...); err != nil {
		return nil, err
	}

	key := s.Key
	if s.Passphrase != "" {
		key = filepath.Join(work, "key.pem")
		if err := run(ctx, "openssl", "pkey", "-in", s.Key, "-passin", "pass:"+s.Passphrase, "-out", key); err != nil {
			return nil, err
		}
	}

	if err := run(ctx, "sbsign", "--key", key, "--cert", s.Cert, "--output", signed, unsigned); err != nil {
		return nil, err
	}

	return os.ReadFile(signed)
}

func run(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}

	return nil
}
