package bootlab_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// Debian's AAVMF (qemu-efi-aarch64): the firmware of an arm64 QEMU virt machine.
const (
	aavmfCode = "/usr/share/AAVMF/AAVMF_CODE.fd"
	aavmfVars = "/usr/share/AAVMF/AAVMF_VARS.fd"
	arm64MAC  = "52:54:00:77:00:0a"
)

// TestNetbootArm64 PXE-boots an arm64 machine (QEMU virt, Cortex-A57 under TCG, Debian's AAVMF) through the
// edge: the firmware DHCPs as UEFI arm64 (option 93 = 11), the edge offers the arm64 iPXE that
// hack/ipxe-arm64.sh takes from Debian's ipxe package, the firmware fetches it over TFTP, and that iPXE
// DHCPs again and fetches the edge's boot script (the edge serves it for the machine's UUID).
func TestNetbootArm64(t *testing.T) {
	bootlab.SkipUnlessLab(t, "qemu-system-aarch64")

	for _, f := range []string{aavmfCode, aavmfVars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian qemu-efi-aarch64)", f)
		}
	}

	root := bootlab.RepoRoot(t)

	out, err := exec.Command(filepath.Join(root, "hack", "ipxe-arm64.sh")).Output()
	if err != nil {
		t.Skipf("lab test: no arm64 iPXE (hack/ipxe-arm64.sh: %v)", err)
	}

	snp := filepath.Join(strings.TrimSpace(string(out)), "snp.efi")

	dir := t.TempDir()
	edgeBin := bootlab.GoBuild(t, root, "./qemu/bootlab/labedge", filepath.Join(dir, "labedge"))

	ipxeDir := filepath.Join(dir, "bootfiles")
	require.NoError(t, os.MkdirAll(ipxeDir, 0o755))

	b, err := os.ReadFile(snp)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "snp-arm64.efi"), b, 0o644))

	site := bootlab.NewSite(t, bootlab.SiteOptions{})

	lines := make(chan string, 64)
	site.Start(t, "edge", lines, "ip", "netns", "exec", site.NS, edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(dir, "state"), "-assets", filepath.Join(dir, "assets"),
		"-log-level", "debug", "-ipxe-dir", ipxeDir)
	waitLine(t, lines, "READY", 30*time.Second)

	// AAVMF's variable store is written by the firmware: each machine gets its own copy.
	vars := filepath.Join(dir, "AAVMF_VARS.fd")
	b, err = os.ReadFile(aavmfVars)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(vars, b, 0o644))

	tap := site.AddTap(t)
	uuid := randomUUID(t)
	serial := filepath.Join(site.Dir, "serial-aavmf.log")

	start := time.Now()

	site.Start(t, "qemu-aavmf", nil, "ip", "netns", "exec", site.MachineNS(), "qemu-system-aarch64",
		"-machine", "virt,accel=tcg", "-cpu", "cortex-a57", "-m", "512", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:"+serial,
		"-smbios", "type=1,uuid="+uuid,
		"-drive", "if=pflash,format=raw,readonly=on,file="+aavmfCode,
		"-drive", "if=pflash,format=raw,file="+vars,
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+arm64MAC+",romfile=,bootindex=0",
		"-device", "virtio-rng-pci")

	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(serial) //nolint:errcheck
			t.Logf("--- serial console (last 4 KiB)\n%s", tailBytes(b, 4096))
		}
	})

	const timeout = 10 * time.Minute

	seen := waitLine(t, lines, "TFTP snp-arm64.efi", timeout)
	tftp := time.Since(start).Round(100 * time.Millisecond)

	require.Contains(t, seen, "DHCP "+arm64MAC+" uefi-arm64 ipxe=false", "the firmware's DHCP was not classified UEFI arm64")

	seen = waitLine(t, lines, "BOOT "+uuid, timeout-time.Since(start))
	script := time.Since(start).Round(100 * time.Millisecond)

	require.Contains(t, seen, "DHCP "+arm64MAC+" uefi-arm64 ipxe=true", "the arm64 iPXE did not DHCP")

	for _, l := range seen {
		require.False(t, strings.HasPrefix(l, "TFTP ") && l != "TFTP snp-arm64.efi", "the edge served %q to an arm64 machine", l)
	}

	t.Logf("aavmf-pxe: power-on to TFTP snp-arm64.efi in %s, to the edge's boot script in %s", tftp, script)
}
