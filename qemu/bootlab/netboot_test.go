package bootlab_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// TestNetbootSeaBIOS boots a BIOS machine (SeaBIOS, whose virtio NIC ROM is iPXE) through the edge:
// ProxyDHCP gives the iPXE ROM the script URL, boot.ipxe gives agent mode (the machine is unknown), the
// kernel and initramfs come from /assets, and the initramfs's /init calls back with its SMBIOS UUID.
func TestNetbootSeaBIOS(t *testing.T) {
	netboot(t, "seabios", false, 3*time.Minute)
}

// TestNetbootSiteDHCPBootFile boots a BIOS machine whose boot file comes from the site's own DHCP server
// (dnsmasq hands iPXE the edge's init.ipxe URL) while the edge's ProxyDHCP answers nobody: the boot script
// request still tells the edge the machine's firmware (iPXE's ${platform}), which is what a later one-time
// PXE boot through its BMC needs.
func TestNetbootSiteDHCPBootFile(t *testing.T) {
	netboot(t, "seabios", true, 3*time.Minute)
}

// TestNetbootOVMF boots a UEFI machine (OVMF) with the NIC's option ROM disabled (romfile=), so OVMF's own
// PXE client takes the ProxyDHCP offer, fetches ipxe.efi over TFTP, and iPXE continues as above.
func TestNetbootOVMF(t *testing.T) {
	netboot(t, "ovmf", false, 5*time.Minute)
}

func randomUUID(t *testing.T) string {
	t.Helper()

	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)

	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80

	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// netboot boots a machine of firmware through the edge; siteBootFile has the site's DHCP server hand out the
// boot file with the edge's ProxyDHCP silent (--discovery off).
func netboot(t *testing.T, firmware string, siteBootFile bool, timeout time.Duration) {
	bootlab.SkipUnlessLab(t, "qemu-system-x86_64", "dpkg-deb")

	for _, f := range []string{"/usr/lib/ipxe/undionly.kpxe", "/usr/lib/ipxe/ipxe.efi", "/usr/share/OVMF/OVMF_CODE_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian ipxe, ovmf)", f)
		}
	}

	root := bootlab.RepoRoot(t)

	kernel, err := bootlab.EnsureKernel(filepath.Join(root, "_out", "bootlab"))
	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab test: %v", err)
	}

	require.NoError(t, err)

	dir := t.TempDir()
	initBin := bootlab.GoBuild(t, root, "./qemu/bootlab/testinit", filepath.Join(dir, "init"))
	edgeBin := bootlab.GoBuild(t, root, "./qemu/bootlab/labedge", filepath.Join(dir, "labedge"))

	// The agent-mode kernel and initramfs, where the edge's default agent paths point.
	agentDir := filepath.Join(dir, "assets", "agent", "x86_64")
	require.NoError(t, os.MkdirAll(agentDir, 0o755))

	vmlinuz, err := os.ReadFile(kernel.Vmlinuz)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(agentDir, "vmlinuz"), vmlinuz, 0o644))

	initData, err := os.ReadFile(initBin)
	require.NoError(t, err)

	initrd, err := os.Create(filepath.Join(agentDir, "initramfs.xz"))
	require.NoError(t, err)
	require.NoError(t, bootlab.BuildInitramfs(initrd, initData, kernel.ModulesDir, []string{"virtio_pci", "virtio_net", "virtio_rng"}))
	require.NoError(t, initrd.Close())

	site := bootlab.NewSite(t, bootlab.SiteOptions{BootFile: siteBootFile})

	discovery := "all"
	if siteBootFile {
		discovery = "off"
	}

	lines := make(chan string, 64)
	site.Start(t, "edge", lines, "ip", "netns", "exec", site.NS, edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(dir, "state"), "-assets", filepath.Join(dir, "assets"),
		"-discovery", discovery, "-log-level", "debug")

	waitLine(t, lines, "READY", 30*time.Second)

	tap := site.AddTap(t)
	uuid := randomUUID(t)
	serial := filepath.Join(site.Dir, "serial-"+firmware+".log")

	args := []string{
		"netns", "exec", site.NS, "qemu-system-x86_64",
		"-m", "512", "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:" + serial,
		"-smbios", "type=1,uuid=" + uuid,
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		// Entropy for the guest: without it getrandom blocks and the /init cannot even pick a DHCP xid.
		"-device", "virtio-rng-pci",
	}

	switch firmware {
	case "seabios":
		args = append(args, "-machine", "pc,accel=tcg", "-boot", "n",
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:01,bootindex=1")
	case "ovmf":
		vars := filepath.Join(dir, "OVMF_VARS.fd")
		b, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(vars, b, 0o644))

		args = append(args, "-machine", "q35,accel=tcg",
			"-drive", "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			"-drive", "if=pflash,format=raw,file="+vars,
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02,romfile=,bootindex=1")
	}

	start := time.Now()

	site.Start(t, "qemu-"+firmware, nil, "ip", args...)

	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(serial) //nolint:errcheck
			t.Logf("--- serial console (last 4 KiB)\n%s", tailBytes(b, 4096))
		}
	})

	seen := waitLine(t, lines, "CALLBACK u="+uuid, timeout)
	t.Logf("%s: power-on to callback in %s", firmware, time.Since(start).Round(100*time.Millisecond))

	// The chain went the way the firmware class says it must.
	want := []string{"DHCP 52:54:00:77:00:01 bios ipxe=true", "BOOT " + uuid + " agent platform=pcbios"}
	if firmware == "ovmf" {
		want = []string{"DHCP 52:54:00:77:00:02 uefi-x86 ipxe=false", "TFTP ipxe.efi", "DHCP 52:54:00:77:00:02 uefi-x86 ipxe=true", "BOOT " + uuid + " agent platform=efi"}
	}

	if siteBootFile {
		want = []string{"BOOT " + uuid + " agent platform=pcbios"}

		for _, l := range seen {
			require.False(t, strings.HasPrefix(l, "DHCP "), "the edge's ProxyDHCP answered (%q) though it should answer nobody", l)
		}
	}

	require.Subset(t, seen, want, "edge saw %q", seen)
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}

	return b
}

// waitLine waits for a line starting with prefix, with a hard deadline, and returns the lines seen before it.
func waitLine(t *testing.T, lines <-chan string, prefix string, timeout time.Duration) []string {
	t.Helper()

	deadline := time.After(timeout)

	var seen []string

	for {
		select {
		case l := <-lines:
			if strings.HasPrefix(l, prefix) {
				return seen
			}

			seen = append(seen, l)
		case <-deadline:
			t.Fatalf("no %q within %s; edge printed %q", prefix, timeout, seen)
		}
	}
}
