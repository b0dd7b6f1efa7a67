package bootlab_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// TestNetbootArm64 PXE-boots an arm64 machine (QEMU virt, Cortex-A57 with 512 MiB under TCG, Debian's AAVMF)
// through the edge to agent mode: the firmware DHCPs as UEFI arm64 (option 93 = 11), fetches the edge's arm64
// iPXE (hack/ipxe-arm64.sh) over TFTP, that iPXE fetches the boot script, and the script boots the arm64 agent
// kernel and initramfs (Debian's arm64 cloud kernel, hack/kernel-arm64.sh; the lab's init cross-compiled) from
// /assets/agent/arm64 with the arm64 console, whose /init calls back.
func TestNetbootArm64(t *testing.T) {
	netbootArm64(t, aavmfPXECase())
}

// TestNetbootArm64HTTPBoot boots the arm64 machine by UEFI HTTP boot at a site whose edge serves no TFTP
// (aavmfHTTPBootCase).
func TestNetbootArm64HTTPBoot(t *testing.T) {
	netbootArm64(t, aavmfHTTPBootCase())
}

// aavmfPXECase is the AAVMF PXE boot to agent mode.
func aavmfPXECase() bootCase {
	return bootCase{firmware: "aavmf", timeout: 10 * time.Minute}
}

// aavmfHTTPBootCase boots AAVMF by its UEFI HTTP boot client (vendor class HTTPClient, option 93 = 19): the
// firmware's PXE is turned off with the same fw_cfg knobs as OVMF's, the edge serves no TFTP and answers with
// http://<edge>/tftp/snp-arm64.efi, and every fetch is HTTP from the edge.
func aavmfHTTPBootCase() bootCase {
	return bootCase{
		firmware: "aavmf-http", edgeArgs: []string{"-no-tftp"}, timeout: 10 * time.Minute, noTFTP: true,
		logHas: [][]string{
			{`"msg":"proxydhcp reply"`, `"firmware":"http-arm64"`, `http://` + bootlab.EdgeIP + `/tftp/snp-arm64.efi`},
			{`"msg":"http"`, `"uri":"/tftp/snp-arm64.efi"`},
		},
		check: func(t *testing.T, seen []string, _ string) {
			t.Helper()
			require.NotContains(t, seen, "DHCP "+arm64MAC+" uefi-arm64 ipxe=false", "the firmware tried PXE: its PXE knobs were not honored")
		},
	}
}

// TestNetbootArm64NoArm64Assets is the bad input of an arm64 machine at a site whose edge holds the x86_64
// agent assets only: the machine reaches the edge's boot script and the edge refuses it by name
// (no_agent_assets_for_arch in its log), and serves it no kernel, least of all the x86_64 one.
func TestNetbootArm64NoArm64Assets(t *testing.T) {
	a := newArm64Lab(t)

	x86 := filepath.Join(a.dir, "assets", "agent", "x86_64")
	require.NoError(t, os.MkdirAll(x86, 0o755))

	for _, name := range []string{"vmlinuz", "initramfs.xz"} {
		require.NoError(t, os.WriteFile(filepath.Join(x86, name), []byte("an x86_64 "+name+" an arm64 machine must never get"), 0o644))
	}

	site := bootlab.NewSite(t, bootlab.SiteOptions{})
	lines := a.startEdge(t, site, nil)
	uuid := randomUUID(t)
	serial, start := a.startMachine(t, site, "aavmf", uuid), time.Now()

	t.Cleanup(func() { logSerialOnFailure(t, serial) })

	seen := waitLine(t, lines, "TFTP snp-arm64.efi", 10*time.Minute)
	require.Contains(t, seen, "DHCP "+arm64MAC+" uefi-arm64 ipxe=false", "the firmware's DHCP was not classified UEFI arm64")

	edgeLog := filepath.Join(site.Dir, "edge.log")
	require.Eventually(t, func() bool {
		return logHasLine(edgeLog, `"reason":"no_agent_assets_for_arch"`, `"arch":"arm64"`, `"uuid":"`+uuid+`"`)
	}, 10*time.Minute, time.Second, "the edge never refused the arm64 machine by name (%s)", edgeLog)

	t.Logf("aavmf-pxe without arm64 assets: power-on to the named refusal in %s", time.Since(start).Round(100*time.Millisecond))

	b, err := os.ReadFile(edgeLog)
	require.NoError(t, err)
	require.NotContains(t, string(b), `"uri":"/assets/`, "the edge served an asset to the refused machine")
	require.NotContains(t, drain(lines), "BOOT "+uuid+" agent platform=efi", "the edge served a boot to the refused machine")
}

// arm64Lab is what an arm64 boot needs: the lab edge, the arm64 iPXE and the test's directory.
type arm64Lab struct {
	root, dir, edgeBin, ipxeDir string
}

// newArm64Lab prepares an arm64 boot, or skips the test where the lab cannot run one.
func newArm64Lab(t *testing.T) arm64Lab {
	t.Helper()

	bootlab.SkipUnlessLab(t, "qemu-system-aarch64", "dpkg-deb")

	for _, f := range []string{aavmfCode, aavmfVars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian qemu-efi-aarch64)", f)
		}
	}

	a := arm64Lab{root: bootlab.RepoRoot(t), dir: t.TempDir()}

	out, err := exec.Command(filepath.Join(a.root, "hack", "ipxe-arm64.sh")).Output()
	if err != nil {
		t.Skipf("lab test: no arm64 iPXE (hack/ipxe-arm64.sh: %v)", err)
	}

	a.edgeBin = bootlab.GoBuild(t, a.root, "./qemu/bootlab/labedge", filepath.Join(a.dir, "labedge"))

	a.ipxeDir = filepath.Join(a.dir, "bootfiles")
	require.NoError(t, os.MkdirAll(a.ipxeDir, 0o755))

	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "snp.efi"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(a.ipxeDir, "snp-arm64.efi"), b, 0o644))

	return a
}

// agentAssets puts the arm64 agent kernel (Debian's arm64 cloud kernel, hack/kernel-arm64.sh) and an initramfs
// of the lab's init cross-compiled for arm64 with the kernel's virtio modules under assets/agent/arm64.
func (a arm64Lab) agentAssets(t *testing.T) {
	t.Helper()

	out, err := exec.Command(filepath.Join(a.root, "hack", "kernel-arm64.sh")).Output()
	if err != nil {
		t.Skipf("lab test: no arm64 kernel (hack/kernel-arm64.sh: %v)", err)
	}

	kroot := strings.TrimSpace(string(out))
	vmlinuz, _ := filepath.Glob(filepath.Join(kroot, "boot", "vmlinuz-*-cloud-arm64"))
	mods, _ := filepath.Glob(filepath.Join(kroot, "lib", "modules", "*-cloud-arm64"))
	require.NotEmpty(t, vmlinuz, "no arm64 kernel under %s", kroot)
	require.NotEmpty(t, mods, "no arm64 modules under %s", kroot)

	agentDir := filepath.Join(a.dir, "assets", "agent", "arm64")
	require.NoError(t, os.MkdirAll(agentDir, 0o755))

	b, err := os.ReadFile(vmlinuz[len(vmlinuz)-1])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(agentDir, "vmlinuz"), b, 0o644))

	initBin := filepath.Join(a.dir, "init-arm64")
	cmd := exec.Command("go", "build", "-ldflags", "-s -w", "-o", initBin, "./qemu/bootlab/testinit")
	cmd.Dir = a.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")

	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build testinit for arm64: %v\n%s", err, b)
	}

	initData, err := os.ReadFile(initBin)
	require.NoError(t, err)

	initrd, err := os.Create(filepath.Join(agentDir, "initramfs.xz"))
	require.NoError(t, err)
	require.NoError(t, bootlab.BuildInitramfs(initrd, initData, mods[len(mods)-1], []string{"virtio_pci", "virtio_net", "virtio_rng"}))
	require.NoError(t, initrd.Close())
}

// startEdge starts the lab edge on the site with the arm64 iPXE and returns its lines once it is ready.
func (a arm64Lab) startEdge(t *testing.T, site *bootlab.Site, args []string) <-chan string {
	t.Helper()

	lines := make(chan string, 64)
	site.Start(t, "edge", lines, "ip", append([]string{"netns", "exec", site.NS, a.edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(a.dir, "state"), "-assets", filepath.Join(a.dir, "assets"),
		"-log-level", "debug", "-ipxe-dir", a.ipxeDir}, args...)...)
	waitLine(t, lines, "READY", 30*time.Second)

	return lines
}

// startMachine powers on the arm64 machine (firmware aavmf: PXE; aavmf-http: UEFI HTTP boot only) and returns
// its serial console's file.
func (a arm64Lab) startMachine(t *testing.T, site *bootlab.Site, firmware, uuid string) string {
	t.Helper()

	// AAVMF's variable store is written by the firmware: each machine gets its own copy.
	vars := filepath.Join(a.dir, "AAVMF_VARS.fd")
	b, err := os.ReadFile(aavmfVars)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(vars, b, 0o644))

	tap := site.AddTap(t)
	serial := filepath.Join(site.Dir, "serial-"+firmware+".log")

	args := []string{"netns", "exec", site.MachineNS(), "qemu-system-aarch64",
		"-machine", "virt,accel=tcg", "-cpu", "cortex-a57", "-m", "512", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:" + serial,
		"-smbios", "type=1,uuid=" + uuid,
		"-drive", "if=pflash,format=raw,readonly=on,file=" + aavmfCode,
		"-drive", "if=pflash,format=raw,file=" + vars,
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + arm64MAC + ",romfile=,bootindex=0",
		// Entropy for the guest: without it getrandom blocks and the /init cannot even pick a DHCP xid.
		"-device", "virtio-rng-pci"}

	if firmware == "aavmf-http" {
		// As OVMF's: the fw_cfg knobs turn the firmware's PXE off, so it boots the NIC by HTTP boot (IPv4) only.
		args = append(args, "-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
			"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
	}

	site.Start(t, "qemu-"+firmware, nil, "ip", args...)

	return serial
}

// netbootArm64 is netboot for an arm64 machine (bc.firmware aavmf or aavmf-http): it boots the machine through
// the edge to agent mode and returns its power-on to callback time.
func netbootArm64(t *testing.T, bc bootCase) time.Duration {
	a := newArm64Lab(t)
	a.agentAssets(t)

	site := bootlab.NewSite(t, bc.site)
	lines := a.startEdge(t, site, bc.edgeArgs)

	uuid := bc.uuid
	if uuid == "" {
		uuid = randomUUID(t)
	}

	start := time.Now()
	serial := a.startMachine(t, site, bc.firmware, uuid)

	t.Cleanup(func() { logSerialOnFailure(t, serial) })

	seen := waitLine(t, lines, "CALLBACK u="+uuid, bc.timeout)
	took := time.Since(start).Round(100 * time.Millisecond)
	t.Logf("%s: power-on to callback in %s", bc.firmware, took)

	if bc.want == nil {
		bc.want = []string{"DHCP " + arm64MAC + " uefi-arm64 ipxe=false", "TFTP snp-arm64.efi"}
		if bc.firmware == "aavmf-http" {
			bc.want = []string{"DHCP " + arm64MAC + " http-arm64 ipxe=false"}
		}

		bc.want = append(bc.want, "DHCP "+arm64MAC+" uefi-arm64 ipxe=true", "BOOT %s agent platform=efi")
	}

	checkEdge(t, bc, uuid, seen, site)

	b, err := os.ReadFile(serial)
	require.NoError(t, err)
	require.Contains(t, string(b), "console=ttyAMA0", "the arm64 kernel was not given its serial console")

	return took
}

// logSerialOnFailure logs the end of a failed test's serial console.
func logSerialOnFailure(t *testing.T, serial string) {
	if t.Failed() {
		b, _ := os.ReadFile(serial) //nolint:errcheck
		t.Logf("--- serial console (last 4 KiB)\n%s", tailBytes(b, 4096))
	}
}

// logHasLine reports whether a line of the file holds every fragment.
func logHasLine(path string, frags ...string) bool {
	b, err := os.ReadFile(path)

	return err == nil && slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
		return !slices.ContainsFunc(frags, func(f string) bool { return !strings.Contains(l, f) })
	})
}

// drain returns the lines waiting on the channel, without waiting for more.
func drain(lines <-chan string) []string {
	var out []string

	for {
		select {
		case l := <-lines:
			out = append(out, l)
		default:
			return out
		}
	}
}
