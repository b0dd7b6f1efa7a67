package bootlab

import (
	"cmp"
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
	// Stub is the EFI stub (default UKIStub, x86); Objcopy the objcopy that writes its PE format (default
	// objcopy; arm64 needs aarch64-linux-gnu-objcopy).
	Stub, Objcopy string
	// InitrdVMA is where the initrd section lies (default 0x3000000: past an x86 bzImage below 48 MiB; an
	// uncompressed arm64 Image needs more room).
	InitrdVMA string
}

// Signer signs EFI binaries with a key and its certificate (PEM); the key may be encrypted with Passphrase
// (sbsign cannot take one: it is decrypted into a scratch directory first).
type Signer struct {
	Key, Cert, Passphrase string
}

// BuildUKI writes u to out as a unified kernel image: the stub with .osrel, .cmdline, .linux and .initrd
// sections added by objcopy; dir is scratch space.
func BuildUKI(ctx context.Context, dir string, u UKI, out string) error {
	work, err := os.MkdirTemp(dir, "uki-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work) //nolint:errcheck

	osrel, cmdline := filepath.Join(work, "os-release"), filepath.Join(work, "cmdline")

	if err := os.WriteFile(osrel, []byte("NAME=\"Outpost lab\"\nID=outpost-lab\n"), 0o644); err != nil {
		return err
	}

	if err := os.WriteFile(cmdline, []byte(u.Cmdline+"\x00"), 0o644); err != nil {
		return err
	}

	stub, objcopy, initrdVMA := cmp.Or(u.Stub, UKIStub), cmp.Or(u.Objcopy, "objcopy"), cmp.Or(u.InitrdVMA, "0x3000000")

	// The section addresses lie past the stub's own sections (tens of KiB).
	args := []string{
		"--add-section", ".osrel=" + osrel, "--change-section-vma", ".osrel=0x20000",
		"--add-section", ".cmdline=" + cmdline, "--change-section-vma", ".cmdline=0x30000",
		"--add-section", ".linux=" + u.Kernel, "--change-section-vma", ".linux=0x2000000",
	}
	if u.Initrd != "" {
		args = append(args, "--add-section", ".initrd="+u.Initrd, "--change-section-vma", ".initrd="+initrdVMA)
	}

	return run(ctx, objcopy, append(args, stub, out)...)
}

// SignEFI signs the EFI binary in into out with s (sbsign); dir is scratch space.
func SignEFI(ctx context.Context, dir, in, out string, s Signer) error {
	key := s.Key

	if s.Passphrase != "" {
		work, err := os.MkdirTemp(dir, "key-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work) //nolint:errcheck

		key = filepath.Join(work, "key.pem")
		if err := run(ctx, "openssl", "pkey", "-in", s.Key, "-passin", "pass:"+s.Passphrase, "-out", key); err != nil {
			return err
		}
	}

	return run(ctx, "sbsign", "--key", key, "--cert", s.Cert, "--output", out, in)
}

// BuildSignedUKI builds u (BuildUKI) and returns it signed by s (SignEFI); dir is scratch space.
func BuildSignedUKI(ctx context.Context, dir string, u UKI, s Signer) ([]byte, error) {
	work, err := os.MkdirTemp(dir, "signed-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work) //nolint:errcheck

	unsigned, signed := filepath.Join(work, "unsigned.efi"), filepath.Join(work, "signed.efi")

	if err := BuildUKI(ctx, work, u, unsigned); err != nil {
		return nil, err
	}

	if err := SignEFI(ctx, work, unsigned, signed, s); err != nil {
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
