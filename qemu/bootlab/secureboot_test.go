package bootlab_test

import (
	"os"
	"path/filepath"
	"slices"
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
// it (the serial console says so). Its NIC comes next: the edge, told by the controller that the site's
// machines enforce Secure Boot (its table; later steps: the machine's own plan), offers only its
// --secure-boot-file, the lab's signed UKI (the agent's kernel, initramfs and command line, signed at test time
// with the snakeoil key), by PXE and never iPXE, and the UKI reaches agent mode (its /init reads the machine's
// plan from the edge's boot script itself, outpost.lab.plan=1, and finds agent mode). The install is
// secureBootInstall's: the signed image the machine's plan names, by UEFI HTTP boot. A disk plan never reaches
// it: the edge offers the machine nothing, so its firmware boots the disk.
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

			unsigned := filepath.Join(dir, "agent-unsigned.efi")
			buildUKI(t, unsigned, initrd, cmdline)
			sign(t, dir, unsigned, filepath.Join(ipxeDir, signedFile))

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

// buildUKI builds a unified kernel image at out (bootlab.BuildUKI): Debian's systemd-boot EFI stub with the
// lab's kernel, the initrd (none when empty) and the command line.
func buildUKI(t *testing.T, out, initrd, cmdline string) {
	t.Helper()

	if _, err := os.Stat(bootlab.UKIStub); err != nil {
		t.Skipf("lab test: %s missing (Debian systemd-boot-efi)", bootlab.UKIStub)
	}

	kernel, err := bootlab.EnsureKernel(filepath.Join(bootlab.RepoRoot(t), "_out", "bootlab"))
	require.NoError(t, err)
	require.NoError(t, bootlab.BuildUKI(t.Context(), t.TempDir(), bootlab.UKI{Kernel: kernel.Vmlinuz, Initrd: initrd, Cmdline: cmdline}, out))
}

// installUKI is the /assets/ name of the lab's signed install UKI (secureBootInstall).
const installUKI = "lab/install-ovmf-secboot.efi"

// secureBootInstall is the Secure Boot machine's install step, as a Talos machine that enforces Secure Boot
// installs: from the signed UKI its plan names (Plan.signed_image, as the controller names the image factory's
// metal-<arch>-secureboot-uki.efi), never from a script. The lab builds that image (the lab's kernel, the
// agent's initramfs, whose /init is the installer when its command line says outpost.lab.image=) with what an
// install needs locked into its command line, as the factory bakes a schematic's kernel arguments in: the
// edge's talos.config=http://<edge>/config?u=${uuid} and the disk image's URL. Signed with the snakeoil key,
// it sits in the edge's files (-assets) and the plan names it ("<uuid> install signed=/assets/<name>").
//
// First the machine boots by PXE only: the edge offers it nothing (signed_image_needs_http_boot: a plan's
// signed image goes by HTTP boot only) and the lab powers it off. Then by UEFI HTTP boot only: its firmware
// refuses the unsigned UKI on its disk ("Access Denied"), the edge offers it the image's /assets/ URL named
// for it (every ProxyDHCP reply since the plan changed, never iPXE nor an unsigned file), its fetch is the
// install boot the edge reports, and the image writes the disk and powers off. It returns the HTTP boot's
// power-on to the image written.
func secureBootInstall(t *testing.T, l *labSite, m *machine, agent bootCase, image string) time.Duration {
	t.Helper()

	kernel, err := bootlab.EnsureKernel(filepath.Join(bootlab.RepoRoot(t), "_out", "bootlab"))
	require.NoError(t, err)

	uki, err := bootlab.BuildSignedUKI(t.Context(), l.dir, bootlab.UKI{
		Kernel: kernel.Vmlinuz, Initrd: filepath.Join(l.dir, "assets", "agent", "x86_64", "initramfs.xz"),
		Cmdline: "console=ttyS0 talos.config=http://" + bootlab.EdgeIP + "/config?u=${uuid} outpost.lab.image=http://" +
			bootlab.EdgeIP + "/assets/" + image,
	}, bootlab.Signer{Key: snakeoilKey, Cert: snakeoilCert, Passphrase: "snakeoil"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(l.dir, "assets", filepath.FromSlash(installUKI)), uki, 0o644))

	edgeLog := filepath.Join(l.site.Dir, "edge.log")
	from := fileSize(t, edgeLog)

	l.setPlan(t, m.uuid+" install signed=/assets/"+installUKI+" secure-boot")

	// By PXE: nothing. The firmware's PXE client is refused at its first DHCP request; the machine is powered
	// off before it tries HTTP boot (PXE's own retries take it tens of seconds more).
	pxe := stepCase(agent, "install-pxe")
	started := time.Now()
	qemu := l.site.Start(t, "qemu-ovmf-secboot-install-pxe", nil, "ip",
		qemuArgs(l.site, pxe, m, filepath.Join(l.site.Dir, "serial-ovmf-secboot-install-pxe.log"))...)

	refused := []string{`"msg":"proxydhcp drop"`, `"reason":"signed_image_needs_http_boot"`, `"mac":"52:54:00:77:00:02"`}
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(logSince(edgeLog, from), func(l string) bool { return containsAll(l, refused) })
	}, 3*time.Minute, 500*time.Millisecond, "the edge did not refuse the machine's PXE boot (signed_image_needs_http_boot)")

	require.NoError(t, qemu.Process.Kill())
	<-l.site.Exited(qemu)
	t.Logf("by PXE: refused (signed_image_needs_http_boot) %s after power-on", time.Since(started).Round(100*time.Millisecond))

	bc := stepCase(agent, "install")
	bc.httpBoot, bc.noTFTP = true, true
	bc.serial, bc.powerOff = "OUTPOST-INSTALL-DONE", true
	bc.want = []string{"BOOT %s install platform= signed=" + installUKI}
	bc.check = func(t *testing.T, _ []string, dir string) {
		t.Helper()

		want := "http://" + bootlab.EdgeIP + "/assets/" + installUKI + "?uuid=" + m.uuid + "&mac=52:54:00:77:00:02"
		offers := 0

		for _, l := range logSince(edgeLog, from) {
			if !strings.Contains(l, `"msg":"proxydhcp reply"`) {
				continue
			}

			offers++

			require.Contains(t, l, `"boot_file":"`+want+`"`, "the edge offered the installing machine something else")
			require.Contains(t, l, `"firmware":"http-x86"`, "the edge answered the installing machine's PXE client")
		}

		require.Positive(t, offers, "no ProxyDHCP reply in the edge's log since the install plan")
		require.Contains(t, readFile(t, filepath.Join(dir, "serial-ovmf-secboot-install.log")), "Access Denied",
			"the firmware did not refuse the unsigned UKI on its disk before the install")
		t.Logf("the edge offered %s (%d offers); the firmware refused the unsigned UKI on its disk", want, offers)
	}

	return l.boot(t, bc, m)
}

// fileSize is the size of the file at name (0 when it does not exist yet).
func fileSize(t *testing.T, name string) int64 {
	t.Helper()

	fi, err := os.Stat(name)
	if os.IsNotExist(err) {
		return 0
	}

	require.NoError(t, err)

	return fi.Size()
}

// logSince is the lines of the log file at name past its first from bytes (none when it cannot be read).
func logSince(name string, from int64) []string {
	b, err := os.ReadFile(name)
	if err != nil || int64(len(b)) < from {
		return nil
	}

	return strings.Split(string(b[from:]), "\n")
}

// containsAll reports whether line holds every fragment.
func containsAll(line string, frags []string) bool {
	return !slices.ContainsFunc(frags, func(f string) bool { return !strings.Contains(line, f) })
}
