package bootlab_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// TestFirmwareMatrix runs one machine per firmware through its life, one subtest per cell (<firmware>/<step>),
// on one site and edge per firmware, the machine keeping its disk and OVMF variables from step to step:
//   - agent: the machine is unknown, boots through the edge to agent mode and calls back;
//   - install: its plan turns to install (applied through the edge's boot-plan service, as the controller
//     does), it boots through the edge again, the install kernel's /init (the lab's installer) fetches the
//     lab's disk image from the edge, writes it to the disk and powers off;
//   - disk: its plan turns to disk (the controller's default hand-off, http-404), it boots through the edge,
//     which hands it off, and the firmware boots the disk the install step wrote (its marker on the serial
//     console). The Secure Boot machine runs no iPXE: the edge offers it nothing while its plan is its disk,
//     and its firmware boots the disk, first in its boot order as a machine with a BMC is left.
//
// A step runs only when the one before it passed (otherwise it is skipped, saying so). Each cell's power-on to
// step time is logged beside the bare-dnsmasq peer's (the same machine, kernel and initramfs booted by dnsmasq
// + static files, no edge) where that peer can boot the firmware. The peer boots agent mode only: static files
// hold no plan per machine, so it has no install or disk step to compare (a site run that way rewrites its
// files for each machine's step, which is what the edge's plans replace).
//
// The firmware:
//   - SeaBIOS: the NIC's iPXE ROM, ProxyDHCP, the script; its disk image is a raw disk whose boot sector prints
//     the marker;
//   - OVMF-PXE: OVMF's PXE, ipxe.efi over TFTP, then as above; its disk image is a GPT disk whose EFI system
//     partition (FAT) holds the lab's UKI (the kernel, the lab's /init, printing the marker);
//   - OVMF-HTTPBoot: OVMF's UEFI HTTP boot only (its PXE knobs off) at a site whose edge serves no TFTP: the edge
//     answers vendor class HTTPClient with http://<edge>/tftp/ipxe.efi, every fetch is HTTP from the edge;
//   - OVMF-SecureBoot: secureBootCase (a signed UKI only; the firmware refuses an unsigned one): agent mode by
//     PXE from the edge's --secure-boot-file; the install from the signed install UKI its plan names
//     (secureBootInstall: by UEFI HTTP boot only, refused by PXE); its disk image's UKI is signed with the
//     snakeoil key;
//   - AAVMF-PXE and AAVMF-HTTPBoot: an arm64 machine (arm64Matrix), by PXE and by UEFI HTTP boot only; its disk
//     image's UKI is an arm64 one.
func TestFirmwareMatrix(t *testing.T) {
	var (
		mu    sync.Mutex
		table []string
	)

	t.Cleanup(func() {
		if len(table) > 0 {
			t.Logf("power-on to each step's end (agent: callback; install: image written; disk: disk's marker), TCG:\n%s",
				strings.Join(table, "\n"))
		}
	})

	for _, row := range []struct {
		firmware string
		bc       func(t *testing.T) bootCase
		bare     bool
	}{
		{"SeaBIOS", func(*testing.T) bootCase { return bootCase{firmware: "seabios", timeout: 3 * time.Minute} }, true},
		{"OVMF-PXE", func(*testing.T) bootCase { return bootCase{firmware: "ovmf", timeout: 5 * time.Minute} }, true},
		{"OVMF-HTTPBoot", func(*testing.T) bootCase { return httpBootCase() }, true},
		{"OVMF-SecureBoot", secureBootCase, false},
	} {
		t.Run(row.firmware, func(t *testing.T) {
			agent := row.bc(t)
			l := newLabSite(t, agent)
			m := l.newMachine(t, agent.firmware, 64<<20)

			image := labDiskImage(t, l, agent)

			if agent.firmware == "ovmf-secboot" {
				// The disk the machine comes with holds the unsigned UKI the firmware must refuse.
				unsigned := filepath.Join(l.dir, "disk-unsigned.img")
				writeESPImage(t, unsigned, filepath.Join(agent.disk, "EFI", "BOOT", "BOOTX64.EFI"))
				copyInto(t, m.disk, unsigned)
			}

			logCell := func(step string, took time.Duration, more string) {
				mu.Lock()
				defer mu.Unlock()

				table = append(table, fmt.Sprintf("%-16s %-8s edge %6s%s", row.firmware, step, took, more))
			}

			var failed string

			for _, step := range []struct {
				name string
				run  func(t *testing.T)
			}{
				{"agent", func(t *testing.T) {
					took := l.boot(t, agent, m)

					more := ""
					if row.bare && !t.Failed() {
						bc := row.bc(t)
						bc.bare = true
						more = fmt.Sprintf("  bare dnsmasq %6s", netboot(t, bc))
					}

					logCell("agent", took, more)
				}},
				{"install", func(t *testing.T) {
					if agent.firmware == "ovmf-secboot" {
						logCell("install", secureBootInstall(t, l, m, agent, image), "")

						return
					}

					l.setPlan(t, m.uuid+" install "+image+secureBootPlan(agent))

					bc := stepCase(agent, "install")
					bc.serial, bc.powerOff = "OUTPOST-INSTALL-DONE", true
					logCell("install", l.boot(t, bc, m), "")
				}},
				{"disk", func(t *testing.T) {
					l.setPlan(t, m.uuid+" disk http-404"+secureBootPlan(agent))

					bc := stepCase(agent, "disk")
					bc.serial = diskMarker

					if agent.firmware == "ovmf-secboot" {
						// The disk first, as a machine with a BMC is left (the controller asks for one-time network
						// boots, for agent mode and install, only): no signed image can hand it to its disk as iPXE
						// does, and the edge offers it nothing while its plan is its disk. With the NIC first it gets
						// there too, once the firmware has tried every network boot option (measured: 3 min 12 s
						// under TCG), which is the wait a Secure Boot machine without a BMC has.
						bc.want = []string{}
						bc.check = func(t *testing.T, seen []string, _ string) {
							for _, l := range seen {
								require.False(t, strings.HasPrefix(l, "TFTP ") || strings.HasPrefix(l, "BOOT "),
									"the edge served the Secure Boot machine whose plan is its disk: %q", l)
							}
						}
					}

					logCell("disk", l.boot(t, bc, m), "")
				}},
			} {
				ok := t.Run(step.name, func(t *testing.T) {
					if failed != "" {
						t.Skipf("not run: step %s of this machine's life failed", failed)
					}

					step.run(t)
				})
				if !ok && failed == "" {
					failed = step.name
				}
			}
		})
	}

	// The arm64 rows, AAVMF-PXE and AAVMF-HTTPBoot (arm64_test.go).
	arm64Matrix(t, func(line string) {
		mu.Lock()
		defer mu.Unlock()

		table = append(table, line)
	})
}

// secureBootPlan ends the plan of a Secure Boot machine: the controller's plans for a machine whose BMC said
// it enforces Secure Boot say so (the plan file replaces the site's table, whose setting no longer holds).
func secureBootPlan(bc bootCase) string {
	if bc.firmware == "ovmf-secboot" {
		return " secure-boot"
	}

	return ""
}

// stepCase is a later step of the machine booted by agent: the same firmware, site flags and time limit, the
// default chain for the step's mode.
func stepCase(agent bootCase, step string) bootCase {
	return bootCase{
		firmware: agent.firmware, timeout: agent.timeout, noTFTP: agent.noTFTP, logHas: agent.logHas, diskFirst: agent.diskFirst, step: step,
	}
}

// labDiskImage writes the lab's disk image for the firmware into the edge's assets and returns its asset name:
// for SeaBIOS a raw disk whose boot sector prints diskMarker; for OVMF a GPT disk whose EFI system partition
// holds the lab's UKI (the lab's kernel, the agent's initramfs, whose /init prints diskMarker when the command
// line says outpost.lab.disk=1), signed with the snakeoil key for Secure Boot.
func labDiskImage(t *testing.T, l *labSite, bc bootCase) string {
	t.Helper()

	name := "lab/disk-" + bc.firmware + ".img"
	out := filepath.Join(l.dir, "assets", filepath.FromSlash(name))
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))

	if bc.firmware == "seabios" {
		require.NoError(t, os.WriteFile(out, bootSector(t, diskMarker), 0o644))

		return name
	}

	uki := filepath.Join(l.dir, "disk-uki.efi")
	buildUKI(t, uki, filepath.Join(l.dir, "assets", "agent", "x86_64", "initramfs.xz"), "console=ttyS0 outpost.lab.disk=1")

	if bc.firmware == "ovmf-secboot" {
		signed := filepath.Join(l.dir, "disk-uki-signed.efi")
		sign(t, l.dir, uki, signed)
		uki = signed
	}

	writeESPImage(t, out, uki)

	return name
}

// copyInto writes the image at the start of the disk file, keeping the disk's size.
func copyInto(t *testing.T, disk, image string) {
	t.Helper()

	b, err := os.ReadFile(image)
	require.NoError(t, err)

	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	require.NoError(t, err)

	_, err = f.WriteAt(b, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// sign signs the EFI binary in with the snakeoil key into out (bootlab.SignEFI; dir is scratch space).
func sign(t *testing.T, dir, in, out string) {
	t.Helper()

	require.NoError(t, bootlab.SignEFI(t.Context(), dir, in, out, bootlab.Signer{Key: snakeoilKey, Cert: snakeoilCert, Passphrase: "snakeoil"}))
}

// httpBootCase boots a UEFI machine by UEFI HTTP boot at a site whose edge serves no TFTP: OVMF's PXE is off
// (its fw_cfg knobs), its HTTP boot client asks with vendor class HTTPClient (option 93 = 16), the edge's
// ProxyDHCP answers with HTTPClient and http://<edge>/tftp/ipxe.efi, the firmware fetches iPXE over HTTP from
// the edge, and iPXE continues to agent mode as over PXE. The site's DHCP server gives the address only.
func httpBootCase() bootCase {
	return bootCase{
		firmware: "ovmf-http", edgeArgs: []string{"-no-tftp"}, timeout: 5 * time.Minute, noTFTP: true,
		logHas: [][]string{
			{`"msg":"proxydhcp reply"`, `"firmware":"http-x86"`, `http://` + bootlab.EdgeIP + `/tftp/ipxe.efi`},
			{`"msg":"http"`, `"uri":"/tftp/ipxe.efi"`},
		},
	}
}
