package bootlab_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// Debian's OVMF ships the snakeoil key it enrolls beside it, encrypted with the passphrase "snakeoil".
const (
	snakeoilKey  = "/usr/share/ovmf/PkKek-1-snakeoil.key"
	snakeoilCert = "/usr/share/ovmf/PkKek-1-snakeoil.pem"
	signedFile   = "outpost-agent-x86_64.efi"
)

// secureBootCase boots a UEFI machine that enforces Secure Boot (OVMF's Secure Boot build with the
// snakeoil key enrolled). Its first boot entry is a disk holding an unsigned UKI: the firmware itself refuses
// it (the serial console says so). Its NIC comes next: the edge, told by the controller that the site's machines
// enforce Secure Boot (its table; later steps: the machine's own plan), offers only the lab's signed UKI (the agent's kernel, initramfs and command line, signed at test time with the
// snakeoil key), never iPXE, and the UKI reaches agent mode. Running no iPXE, the UKI's /init reads the
// machine's plan from the edge's boot script itself (outpost.lab.plan=1) and follows an install plan (writes
// the disk). A disk plan never reaches it: the edge offers the machine nothing, so its firmware boots the disk.
func secureBootCase(t *testing.T) bootCase {
	t.Helper()
	bootlab.SkipUnlessLab(t, "objcopy", "sbsign", "openssl")

	for _, f := range []string{snakeoilKey, snakeoilCert, "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd", "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian ovmf)", f)
		}
	}

	esp := filepath.Join(t.TempDir(), "esp")

	return bootCase{
		firmware: "ovmf-secboot", disk: esp, diskFirst: true, timeout: 5 * time.Minute,
		prepare: func(t *testing.T, dir string) []string {
			t.Helper()

			initrd := filepath.Join(dir, "assets", "agent", "x86_64", "initramfs.xz")
			cmdline := "console=ttyS0 talos.config=http://" + bootlab.EdgeIP + "/config outpost.lab.plan=1"

			// The unsigned UKI on the disk: the firmware must refuse it.
			require.NoError(t, os.MkdirAll(filepath.Join(esp, "EFI", "BOOT"), 0o755))
			buildUKI(t, filepath.Join(esp, "EFI", "BOOT", "BOOTX64.EFI"), initrd, cmdline)

			// The edge's boot files: Debian's iPXE and the signed UKI.
			ipxeDir := filepath.Join(dir, "bootfiles")
			require.NoError(t, os.MkdirAll(ipxeDir, 0o755))

			for _, name := range []string{"undionly.kpxe", "ipxe.efi", "snponly.efi"} {
				b, err := os.ReadFile(filepath.Join(bootlab.IPXEFor(t), name))
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, name), b, 0o644))
			}

			// sbsign cannot take a passphrase: the key is decrypted into the test's directory first.
			key := filepath.Join(dir, "snakeoil.key")
			bootlab.Run(t, "openssl", "pkey", "-in", snakeoilKey, "-passin", "pass:snakeoil", "-out", key)

			unsigned := filepath.Join(dir, "agent-unsigned.efi")
			buildUKI(t, unsigned, initrd, cmdline)
			bootlab.Run(t, "sbsign", "--key", key, "--cert", snakeoilCert, "--output", filepath.Join(ipxeDir, signedFile), unsigned)

			// The site enforces Secure Boot as the controller says it (controller site set --secure-boot on):
			// the machine's first boot has no plan yet, and the site's setting is what the edge goes by. The edge
			// has no --secure-boot of its own.
			return []string{"-ipxe-dir", ipxeDir, "-signed-file", signedFile, "-secure-boot-site"}
		},
		check: func(t *testing.T, seen []string, dir string) {
			for _, l := range seen {
				require.False(t, strings.HasPrefix(l, "TFTP ") && l != "TFTP "+signedFile, "the edge served %q to a Secure Boot machine", l)
				require.False(t, strings.Contains(l, "ipxe=true"), "the machine ran iPXE: %q", l)
			}

			// The edge never offered anything but the signed UKI.
			edgeLog := readFile(t, filepath.Join(dir, "edge.log"))
			offers := 0

			for _, l := range strings.Split(edgeLog, "\n") {
				if strings.Contains(l, `"msg":"proxydhcp reply"`) {
					offers++

					require.Contains(t, l, `"boot_file":"`+signedFile+`"`, "the edge offered something else")
				}
			}

			require.Positive(t, offers, "no ProxyDHCP reply in the edge's log")

			// The firmware refused the unsigned UKI on the disk itself.
			var refusal string

			for _, l := range strings.Split(readFile(t, filepath.Join(dir, "serial-ovmf-secboot.log")), "\n") {
				if strings.Contains(l, "Access Denied") {
					refusal = strings.TrimSpace(l)

					break
				}
			}

			require.NotEmpty(t, refusal, "the firmware did not refuse the unsigned UKI")
			t.Logf("the firmware refused the unsigned UKI: %q; the edge offered only %s (%d offers)", refusal, signedFile, offers)
		},
	}
}

// buildUKI builds a unified kernel image at out: Debian's systemd-boot EFI stub with the lab's kernel, the
// initrd (none when empty) and the command line added as sections (objcopy).
func buildUKI(t *testing.T, out, initrd, cmdline string) {
	t.Helper()

	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	if _, err := os.Stat(stub); err != nil {
		t.Skipf("lab test: %s missing (Debian systemd-boot-efi)", stub)
	}

	kernel, err := bootlab.EnsureKernel(filepath.Join(bootlab.RepoRoot(t), "_out", "bootlab"))
	require.NoError(t, err)

	dir := t.TempDir()
	osrel := filepath.Join(dir, "os-release")
	cmd := filepath.Join(dir, "cmdline")

	require.NoError(t, os.WriteFile(osrel, []byte("NAME=\"Outpost lab\"\nID=outpost-lab\n"), 0o644))
	require.NoError(t, os.WriteFile(cmd, []byte(cmdline+"\x00"), 0o644))

	// The section addresses lie past the stub's own sections (tens of KiB), the kernel's below 48 MiB.
	args := []string{
		"--add-section", ".osrel=" + osrel, "--change-section-vma", ".osrel=0x20000",
		"--add-section", ".cmdline=" + cmd, "--change-section-vma", ".cmdline=0x30000",
		"--add-section", ".linux=" + kernel.Vmlinuz, "--change-section-vma", ".linux=0x2000000",
	}
	if initrd != "" {
		args = append(args, "--add-section", ".initrd="+initrd, "--change-section-vma", ".initrd=0x3000000")
	}

	bootlab.Run(t, "objcopy", append(args, stub, out)...)
}
