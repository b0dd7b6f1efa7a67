package bootlab_test

import (
	"debug/pe"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/fat16"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// diskMarker is what the lab's disks print on the serial console once booted.
const diskMarker = "OUTPOST-DISK-BOOTED"

// TestScriptRetries boots a BIOS machine whose agent kernel download fails twice (the edge answers 503) and
// then succeeds: the kernel script's retry branch fetches it a third time and the machine reaches agent mode.
func TestScriptRetries(t *testing.T) {
	const kernel = "/assets/agent/x86_64/vmlinuz"

	netboot(t, bootCase{
		firmware: "seabios", edgeArgs: []string{"-fail-first", kernel + "=2"}, timeout: 3 * time.Minute,
		want:   []string{"DHCP 52:54:00:77:00:01 bios ipxe=true", "FAILED " + kernel, "BOOT %s agent platform=pcbios"},
		logHas: [][]string{{`"msg":"http"`, `"uri":"` + kernel + `"`}},
		check: func(t *testing.T, seen []string, dir string) {
			failed := 0

			for _, l := range seen {
				if l == "FAILED "+kernel {
					failed++
				}
			}

			require.Equal(t, 2, failed, "the kernel download failed %d times, want 2 (edge printed %q)", failed, seen)

			got := strings.Count(readFile(t, filepath.Join(dir, "edge.log")), `"uri":"`+kernel+`"`)
			require.Equal(t, 3, got, "the machine asked for its kernel %d times, want 3 (two failures, one success)", got)
		},
	})
}

func readFile(t *testing.T, name string) string {
	t.Helper()

	b, err := os.ReadFile(name)
	require.NoError(t, err)

	return string(b)
}

// TestDiskHandOffs boots a machine whose plan is disk, once per hand-off method and firmware: the edge hands it
// off (ipxe-exit: a script that exits to the firmware; http-404: no script, init.ipxe exits; ipxe-sanboot: iPXE
// boots the first disk itself, or, on UEFI where no SAN drive is attached, exits) and the firmware boots the
// machine's disk, which prints diskMarker on the serial console: on SeaBIOS a raw disk's boot sector, on OVMF
// the lab's UKI in the disk's EFI system partition (its /init prints the marker when its command line says
// outpost.lab.disk=1).
func TestDiskHandOffs(t *testing.T) {
	bootlab.SkipUnlessLab(t, "qemu-system-x86_64", "dpkg-deb")

	for _, fw := range []struct{ name, firmware, dhcp, platform string }{
		{"SeaBIOS", "seabios", "DHCP 52:54:00:77:00:01 bios ipxe=true", "pcbios"},
		{"OVMF", "ovmf", "DHCP 52:54:00:77:00:02 uefi-x86 ipxe=true", "efi"},
	} {
		t.Run(fw.name, func(t *testing.T) {
			disk := t.TempDir()

			var prepare func(t *testing.T, dir string) []string
			if fw.firmware == "seabios" {
				require.NoError(t, os.WriteFile(filepath.Join(disk, "disk.raw"), bootSector(t, diskMarker), 0o644))
			} else {
				// The UKI needs the agent's initramfs (the lab's /init), built with the site.
				prepare = func(t *testing.T, dir string) []string {
					t.Helper()

					require.NoError(t, os.MkdirAll(filepath.Join(disk, "EFI", "BOOT"), 0o755))
					buildUKI(t, filepath.Join(disk, "EFI", "BOOT", "BOOTX64.EFI"),
						filepath.Join(dir, "assets", "agent", "x86_64", "initramfs.xz"), "console=ttyS0 outpost.lab.disk=1")

					return nil
				}
			}

			for _, method := range []string{"http-404", "ipxe-exit", "ipxe-sanboot"} {
				t.Run(method, func(t *testing.T) {
					uuid := randomUUID(t)
					netboot(t, bootCase{
						firmware: fw.firmware, uuid: uuid, disk: disk, serial: diskMarker, timeout: 4 * time.Minute,
						edgeArgs: []string{"-disk", uuid + "=" + method}, prepare: prepare,
						want: []string{fw.dhcp, "BOOT %s disk platform=" + fw.platform},
						check: func(t *testing.T, seen []string, _ string) {
							for _, l := range seen {
								require.False(t, strings.HasPrefix(l, "BOOT "+uuid+" agent"), "the machine was booted into agent mode: %q", l)
							}
						},
					})
				})
			}
		})
	}
}

// bootSector returns a 1 MiB raw disk whose MBR boot code writes marker to COM1 and halts (hand-assembled
// 16-bit code; the disk carries no partition).
func bootSector(t *testing.T, marker string) []byte {
	t.Helper()

	code := []byte{
		0x31, 0xc0, // xor ax, ax
		0x8e, 0xd8, // mov ds, ax
		0xfc,             // cld
		0xbe, 0x17, 0x7c, // mov si, 0x7c17 (the message, right after the code)
		0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1)
		0xac,       // lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz halt
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp lodsb
		0xfa,       // halt: cli
		0xf4,       // hlt
		0xeb, 0xfc, // jmp halt
	}
	require.Len(t, code, 0x17)

	disk := make([]byte, 1<<20)
	copy(disk, code)
	copy(disk[len(code):], marker+"\r\n\x00")
	disk[510], disk[511] = 0x55, 0xaa

	return disk
}

// writeESPImage writes a GPT disk image to out (whole, replacing it) with one EFI system partition (FAT16)
// holding loader as the removable-media boot file, EFI/BOOT/BOOTX64.EFI (BOOTAA64.EFI for an arm64 loader),
// which UEFI firmware boots from a disk with no boot entry of its own.
func writeESPImage(t *testing.T, out, loader string) {
	t.Helper()

	const (
		mib    = 1 << 20
		sector = 512
	)

	src, err := os.Open(loader)
	require.NoError(t, err)

	defer src.Close() //nolint:errcheck

	st, err := src.Stat()
	require.NoError(t, err)

	// At least 8 MiB, so that FAT16 holds enough clusters; the loader with 1 MiB to spare; 1 MiB before the
	// partition and after it for the GPT and its backup.
	esp := max(8*mib, (st.Size()+2*mib-1)/mib*mib)
	size := esp + 2*mib

	f, err := os.OpenFile(out, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)

	defer f.Close() //nolint:errcheck

	require.NoError(t, f.Truncate(size))

	backend := file.New(f, false)
	table := &gpt.Table{
		LogicalSectorSize: sector, PhysicalSectorSize: sector, ProtectiveMBR: true,
		Partitions: []*gpt.Partition{{
			Index: 1, Start: mib / sector, End: uint64(mib+esp)/sector - 1, Type: gpt.EFISystemPartition, Name: "EFI system partition",
		}},
	}
	require.NoError(t, table.Write(f, size))

	fat, err := fat16.Create(backend, esp, mib, sector, "OUTPOSTESP", true)
	require.NoError(t, err)
	require.NoError(t, fat.Mkdir("/EFI/BOOT"))

	bootFile := "/EFI/BOOT/BOOTX64.EFI"
	if pf, err := pe.Open(loader); err == nil {
		if pf.Machine == pe.IMAGE_FILE_MACHINE_ARM64 {
			bootFile = "/EFI/BOOT/BOOTAA64.EFI"
		}

		pf.Close() //nolint:errcheck
	}

	dst, err := fat.OpenFile(bootFile, os.O_CREATE|os.O_RDWR)
	require.NoError(t, err)

	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	require.NoError(t, f.Close())
}

// TestBootThroughRelay boots a BIOS machine one DHCP relay away from its edge: the machine's network is routed
// to the edge's, Debian's isc-dhcp-relay forwards its requests to the site's DHCP server and to the edge, the
// edge answers the relay (giaddr) and the machine reaches agent mode over the router.
func TestBootThroughRelay(t *testing.T) {
	bootlab.SkipUnlessLab(t, "dhcrelay")
	netboot(t, bootCase{
		firmware: "seabios", site: bootlab.SiteOptions{Relay: true}, timeout: 3 * time.Minute,
		logHas: [][]string{{`"msg":"proxydhcp reply"`, `"dest":"` + bootlab.RelayDownIP + `:67"`}},
		check: func(t *testing.T, _ []string, dir string) {
			// The machine called back from its own network, through the router.
			require.Contains(t, readFile(t, filepath.Join(dir, "edge.log")), `"uri":"/ipxe/init.ipxe","remote":"10.78.0.`)
		},
	})
}
