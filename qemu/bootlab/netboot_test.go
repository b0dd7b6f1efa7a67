package bootlab_test

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// TestNetbootSeaBIOS boots a BIOS machine (SeaBIOS, whose virtio NIC ROM is iPXE) through the edge:
// ProxyDHCP gives the iPXE ROM the script URL, boot.ipxe gives agent mode (the machine is unknown), the
// kernel and initramfs come from /assets, and the initramfs's /init calls back with its SMBIOS UUID.
func TestNetbootSeaBIOS(t *testing.T) {
	netboot(t, bootCase{firmware: "seabios", timeout: 3 * time.Minute})
}

// TestNetbootSiteDHCPBootFile boots a BIOS machine whose boot file comes from the site's own DHCP server
// (dnsmasq hands iPXE the edge's init.ipxe URL) while the edge's ProxyDHCP answers nobody: the boot script
// request still tells the edge the machine's firmware (iPXE's ${platform}), which is what a later one-time
// PXE boot through its BMC needs.
func TestNetbootSiteDHCPBootFile(t *testing.T) {
	netboot(t, bootCase{
		firmware: "seabios", site: bootlab.SiteOptions{BootFile: true}, edgeArgs: []string{"-discovery", "off"}, timeout: 3 * time.Minute,
		want: []string{"BOOT %s agent platform=pcbios"}, noDHCP: true,
	})
}

// TestNetbootKnownOnly runs a site with discovery known, as the controller sets it (controller site set
// --discovery known, controller site machine add): the registered BIOS machine boots, while an unregistered one
// on the same bridge, booting at the same time, gets no ProxyDHCP answer at all (the edge drops it as an
// unknown machine).
func TestNetbootKnownOnly(t *testing.T) {
	netboot(t, bootCase{
		firmware: "seabios", edgeArgs: []string{"-register-macs", "52:54:00:77:00:01"}, timeout: 3 * time.Minute, stranger: true,
	})
}

// TestNetbootProxy4011Only runs the edge's ProxyDHCP on port 4011 only, beside a site DHCP server that names
// the edge as its boot server (dnsmasq --pxe-service=x86PC,...,10.77.0.2): the BIOS machine's iPXE gets its
// lease and boot menu from dnsmasq, asks the edge on 4011 for the menu's boot item, and boots agent mode.
func TestNetbootProxy4011Only(t *testing.T) {
	netboot(t, bootCase{
		firmware: "seabios", site: bootlab.SiteOptions{PXEService: true}, edgeArgs: []string{"-proxydhcp-mode", "4011-only"},
		timeout: 3 * time.Minute, want: []string{"DHCP 52:54:00:77:00:01 bios ipxe=true", "BOOT %s agent platform=pcbios"},
		// answered on 4011 (the edge's reply log says role pxe); port 67 is left to the site's server
		logHas: [][]string{{`"msg":"proxydhcp reply"`, `"role":"pxe"`}},
	})
}

// TestNetbootProxy4011OnlyOVMF is TestNetbootProxy4011Only for a UEFI machine: OVMF's own PXE client takes
// dnsmasq's menu, asks the edge on 4011 (from port 4011) and gets ipxe.efi over TFTP; iPXE's UEFI build has no
// PXE menus, so it takes the edge's script URL from the site's server (SiteOptions.PXEService).
func TestNetbootProxy4011OnlyOVMF(t *testing.T) {
	netboot(t, bootCase{
		firmware: "ovmf", site: bootlab.SiteOptions{PXEService: true}, edgeArgs: []string{"-proxydhcp-mode", "4011-only"},
		timeout: 5 * time.Minute, want: []string{"DHCP 52:54:00:77:00:02 uefi-x86 ipxe=false", "TFTP ipxe.efi", "BOOT %s agent platform=efi"},
		logHas: [][]string{{`"msg":"proxydhcp reply"`, `"role":"pxe"`, `"ipxe":false`}},
	})
}

// TestNetbootOVMF boots a UEFI machine (OVMF) with the NIC's option ROM disabled (romfile=), so OVMF's own
// PXE client takes the ProxyDHCP offer, fetches ipxe.efi over TFTP, and iPXE continues as above.
func TestNetbootOVMF(t *testing.T) {
	netboot(t, bootCase{firmware: "ovmf", timeout: 5 * time.Minute})
}

// strangerMAC is the unregistered machine's MAC (bootCase.stranger).
const strangerMAC = "52:54:00:77:00:03"

// bootCase is one lab boot: the firmware, the site's DHCP server, the edge's flags, and what the edge must
// have printed before the machine called back.
type bootCase struct {
	firmware string
	site     bootlab.SiteOptions
	edgeArgs []string
	timeout  time.Duration
	// want are edge lines (%s: the machine's UUID); nil: the chain the firmware class goes through.
	want []string
	// noDHCP says the edge's ProxyDHCP must answer nobody.
	noDHCP bool
	// stranger boots a second, unregistered BIOS machine beside the first: the edge must drop its every
	// request as an unknown machine's and answer none.
	stranger bool
	// logHas are lines the edge's log must hold, each given as the fragments one line holds.
	logHas [][]string
	// noTFTP says the edge must serve no TFTP file (the boot went over HTTP only).
	noTFTP bool
	// httpBoot boots an OVMF machine's NIC by UEFI HTTP boot only (its PXE knobs off), as ovmf-http always is.
	httpBoot bool
	// uuid is the machine's SMBIOS UUID (random when empty).
	uuid string
	// disk is a directory of files the machine's second boot device (a virtio disk after the NIC) is made
	// from: a raw image "disk.raw" for SeaBIOS, an EFI system partition's tree for OVMF.
	disk string
	// prepare, when set, runs once the agent's kernel and initramfs are under dir/assets and returns more
	// edge flags.
	prepare func(t *testing.T, dir string) []string
	// diskFirst boots the disk before the NIC.
	diskFirst bool
	// bare boots the machine from the bare-dnsmasq peer (SiteOptions.Bare) instead of an edge.
	bare bool
	// check, when set, checks more: seen are the edge's lines, dir the site's directory (edge.log, serial logs).
	check func(t *testing.T, seen []string, dir string)
	// serial, when set, is what the machine's serial console must print instead of the edge's CALLBACK
	// line (the machine boots something other than the agent).
	serial string
	// step names a step of a machine's life (the firmware matrix's install and disk): the boot mode the edge
	// must have served (default chain) and the serial log's name; empty: agent.
	step string
	// powerOff waits, after the step's marker, for the machine to power off (QEMU exits).
	powerOff bool
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

// netboot boots a machine as bc says through the edge and returns its power-on to callback (or serial
// marker) time.
func netboot(t *testing.T, bc bootCase) time.Duration {
	return newLabSite(t, bc).boot(t, bc, nil)
}

// labSite is a site and its edge (or its bare-dnsmasq peer) with the lab's boot files, for one boot or for a
// machine's boots one after the other (the firmware matrix's steps).
type labSite struct {
	dir   string
	site  *bootlab.Site
	lines chan string
	// edge is the edge's process (nil for the bare peer); planFile its -plan-file (see setPlan).
	edge     *exec.Cmd
	planFile string
}

// machine is one lab machine kept across boots: its SMBIOS UUID, its tap, its disk (a raw image, written by
// its install step) and its OVMF variables.
type machine struct {
	uuid, tap, disk, vars string
}

// newLabSite builds the lab's binaries and the agent's kernel and initramfs, and starts the site and its edge
// (bc's site, edgeArgs, prepare, bare and stranger). The install kernel and initramfs (/assets/install/x86_64)
// are the agent's: the lab's /init is the installer when its command line says so.
func newLabSite(t *testing.T, bc bootCase) *labSite {
	bootlab.SkipUnlessLab(t, "qemu-system-x86_64", "dpkg-deb")

	if _, err := os.Stat("/usr/share/OVMF/OVMF_CODE_4M.fd"); err != nil {
		t.Skipf("lab test: OVMF missing (Debian ovmf): %v", err)
	}

	root := bootlab.RepoRoot(t)
	ipxeDir := bootlab.IPXEFor(t)

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
	require.NoError(t, bootlab.BuildInitramfs(initrd, initData, kernel.ModulesDir, []string{"virtio_pci", "virtio_net", "virtio_rng", "virtio_blk"}))
	require.NoError(t, initrd.Close())

	installDir := filepath.Join(dir, "assets", "install", "x86_64")
	require.NoError(t, os.MkdirAll(installDir, 0o755))

	for _, name := range []string{"vmlinuz", "initramfs.xz"} {
		require.NoError(t, os.Link(filepath.Join(agentDir, name), filepath.Join(installDir, name)))
	}

	edgeArgs := bc.edgeArgs
	if bc.prepare != nil {
		edgeArgs = append(append([]string(nil), edgeArgs...), bc.prepare(t, dir)...)
	}

	siteOpts := bc.site
	if bc.bare {
		siteOpts.Bare = bareFiles(t, dir, ipxeDir, agentDir)
	}

	l := &labSite{dir: dir, site: bootlab.NewSite(t, siteOpts), lines: make(chan string, 64), planFile: filepath.Join(dir, "plans")}
	if bc.bare {
		return l
	}

	require.NoError(t, os.WriteFile(l.planFile, nil, 0o644))

	l.edge = l.site.Start(t, "edge", l.lines, "ip", append([]string{"netns", "exec", l.site.NS, edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(dir, "state"), "-assets", filepath.Join(dir, "assets"),
		"-log-level", "debug", "-plan-file", l.planFile, "-ipxe-dir", ipxeDir}, edgeArgs...)...)

	waitLine(t, l.lines, "READY", 30*time.Second)

	if bc.stranger {
		strangerTap := l.site.AddTap(t)
		l.site.Start(t, "qemu-stranger", nil, "ip", "netns", "exec", l.site.NS, "qemu-system-x86_64",
			"-m", "256", "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot", "-machine", "pc,accel=tcg", "-boot", "n",
			"-netdev", "tap,id=n0,ifname="+strangerTap+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,mac="+strangerMAC+",bootindex=1")
	}

	return l
}

// setPlan changes the site's table as the controller does (labedge -plan-file, re-read at SIGHUP, applied
// through the edge's boot-plan service): plan is the file's new content ("<uuid> install <image>", "<uuid>
// disk <method>").
func (l *labSite) setPlan(t *testing.T, plan string) {
	t.Helper()

	require.NoError(t, os.WriteFile(l.planFile, []byte(plan+"\n"), 0o644))
	require.NoError(t, l.edge.Process.Signal(syscall.SIGHUP))
	waitLine(t, l.lines, "APPLIED ", 30*time.Second)
}

// newMachine returns a machine of the firmware with a fresh UUID, its own tap on the site, an empty raw disk
// of size bytes (none when 0) and, for OVMF, its own copy of the firmware's variables.
func (l *labSite) newMachine(t *testing.T, firmware string, size int64) *machine {
	t.Helper()

	m := &machine{uuid: randomUUID(t), tap: l.site.AddTap(t)}

	if size > 0 {
		m.disk = filepath.Join(l.dir, "disk-"+firmware+".raw")
		f, err := os.Create(m.disk)
		require.NoError(t, err)
		require.NoError(t, f.Truncate(size))
		require.NoError(t, f.Close())
	}

	if firmware != "seabios" {
		m.vars = filepath.Join(l.dir, "OVMF_VARS-"+firmware+".fd")

		varsTemplate := "/usr/share/OVMF/OVMF_VARS_4M.fd"
		if firmware == "ovmf-secboot" {
			varsTemplate = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
		}

		b, err := os.ReadFile(varsTemplate)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(m.vars, b, 0o644))
	}

	return m
}

// boot powers the machine on (a new one as bc says when m is nil), waits for what bc's step ends with (the
// callback, or bc.serial on the serial console; with bc.powerOff, the machine powering off too) and returns
// the time from power-on to it.
func (l *labSite) boot(t *testing.T, bc bootCase, m *machine) time.Duration {
	site, lines := l.site, l.lines

	if m == nil {
		m = l.newMachine(t, bc.firmware, 0)
		if bc.uuid != "" {
			m.uuid = bc.uuid
		}
	}

	// What the edge printed for an earlier boot of the site is not this boot's.
	for drained := false; !drained; {
		select {
		case <-lines:
		default:
			drained = true
		}
	}

	uuid, firmware, timeout := m.uuid, bc.firmware, bc.timeout

	serial := filepath.Join(site.Dir, "serial-"+firmware+".log")
	if bc.step != "" {
		serial = filepath.Join(site.Dir, "serial-"+firmware+"-"+bc.step+".log")
	}

	start := time.Now()

	qemu := site.Start(t, "qemu-"+firmware+bc.step, nil, "ip", qemuArgs(site, bc, m, serial)...)

	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(serial) //nolint:errcheck
			t.Logf("--- serial console (last 4 KiB)\n%s", tailBytes(b, 4096))
		}
	})

	if bc.bare {
		// The bare peer prints nothing: the machine's /init says on its console that it called back.
		waitSerial(t, lines, serial, "OUTPOST-CALLBACK-DONE", timeout)

		took := time.Since(start).Round(100 * time.Millisecond)
		t.Logf("%s (bare dnsmasq): power-on to callback in %s", firmware, took)

		return took
	}

	var seen []string

	if bc.serial != "" {
		seen = waitSerial(t, lines, serial, bc.serial, timeout)
	} else {
		seen = waitLine(t, lines, "CALLBACK u="+uuid, timeout)
	}

	took := time.Since(start).Round(100 * time.Millisecond)

	if bc.serial != "" {
		t.Logf("%s: power-on to %q on the serial console in %s", firmware, bc.serial, took)
	} else {
		t.Logf("%s: power-on to callback in %s", firmware, took)
	}

	if bc.powerOff {
		select {
		case <-site.Exited(qemu):
		case <-time.After(time.Minute):
			t.Fatalf("the machine did not power off within a minute of %s", took)
		}
	}

	checkEdge(t, bc, uuid, seen, site)

	return took
}

// qemuArgs are the arguments of "ip" that run the machine m as bc says (its firmware, disk and boot order) in
// the site's machine namespace, its serial console written to serial.
func qemuArgs(site *bootlab.Site, bc bootCase, m *machine, serial string) []string {
	uuid, firmware := m.uuid, bc.firmware

	args := []string{
		"netns", "exec", site.MachineNS(), "qemu-system-x86_64",
		"-m", "512", "-smp", "1", "-nodefaults", "-display", "none",
		"-serial", "file:" + serial,
		"-smbios", "type=1,uuid=" + uuid,
		"-netdev", "tap,id=n0,ifname=" + m.tap + ",script=no,downscript=no",
		// Entropy for the guest: without it getrandom blocks and the /init cannot even pick a DHCP xid.
		"-device", "virtio-rng-pci", "-no-reboot",
	}

	// The machine's disk: its own raw image (written by its install step), or bc.disk's files read only.
	var drive string

	switch {
	case m.disk != "":
		drive = "format=raw,file=" + m.disk
	case bc.disk != "" && firmware == "seabios":
		drive = "format=raw,readonly=on,file=" + filepath.Join(bc.disk, "disk.raw")
	case bc.disk != "":
		// QEMU's vvfat: the directory as a FAT disk, read only.
		drive = "format=raw,readonly=on,file=fat:" + bc.disk
	}

	switch firmware {
	case "seabios":
		// SeaBIOS's own log (its debug port) says which device it booted.
		args = append(args, "-chardev", "file,id=dbg,path="+filepath.Join(site.Dir, "seabios.log"), "-device", "isa-debugcon,iobase=0x402,chardev=dbg")
		args = append(args, "-machine", "pc,accel=tcg", "-boot", "n",
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:01,bootindex=1")

		if drive != "" {
			args = append(args, "-drive", "if=none,id=d0,"+drive, "-device", "virtio-blk-pci,drive=d0,bootindex=2")
		}
	case "ovmf", "ovmf-http", "ovmf-secboot":
		code, machineType := "/usr/share/OVMF/OVMF_CODE_4M.fd", "q35,accel=tcg"
		if firmware == "ovmf-secboot" {
			// Secure Boot enforcing with the snakeoil key enrolled; the Secure Boot build needs SMM.
			code, machineType = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd", "q35,smm=on,accel=tcg"
			args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on")
		}

		args = append(args, "-machine", machineType,
			"-drive", "if=pflash,format=raw,readonly=on,file="+code,
			"-drive", "if=pflash,format=raw,file="+m.vars,
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02,romfile=,bootindex=1")

		if drive != "" {
			index := "2"
			if bc.diskFirst {
				index = "0"
			}

			args = append(args, "-drive", "if=none,id=d0,"+drive, "-device", "virtio-blk-pci,drive=d0,bootindex="+index)
		}

		if firmware == "ovmf-http" || bc.httpBoot {
			// OVMF's boot options for the NIC are PXE then HTTP boot, IPv4 then IPv6: its fw_cfg knobs turn
			// PXE off, so the firmware boots the NIC by UEFI HTTP boot (IPv4) only.
			args = append(args, "-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
				"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
		}
	}

	return args
}

// checkEdge checks the edge's lines (seen) and log against bc.
func checkEdge(t *testing.T, bc bootCase, uuid string, seen []string, site *bootlab.Site) {
	t.Helper()

	firmware := bc.firmware

	// The chain went the way the firmware class says it must.
	mode := cmp.Or(bc.step, "agent")

	want := []string{"DHCP 52:54:00:77:00:01 bios ipxe=true", "BOOT %s " + mode + " platform=pcbios"}
	switch firmware {
	case "ovmf":
		want = []string{"DHCP 52:54:00:77:00:02 uefi-x86 ipxe=false", "TFTP ipxe.efi", "DHCP 52:54:00:77:00:02 uefi-x86 ipxe=true", "BOOT %s " + mode + " platform=efi"}
	case "ovmf-http":
		want = []string{"DHCP 52:54:00:77:00:02 http-x86 ipxe=false", "DHCP 52:54:00:77:00:02 uefi-x86 ipxe=true", "BOOT %s " + mode + " platform=efi"}
	case "ovmf-secboot":
		// No iPXE: the signed UKI's /init asks for the machine's boot script itself.
		want = []string{"DHCP 52:54:00:77:00:02 uefi-x86 ipxe=false", "TFTP " + signedFile, "BOOT %s " + mode + " platform=efi"}
	}

	if bc.step != "" {
		// The edge reports a machine's DHCP requests once, at its first boot (the agent step).
		want = slices.DeleteFunc(want, func(w string) bool { return strings.HasPrefix(w, "DHCP ") })
	}

	if bc.want != nil {
		want = append([]string(nil), bc.want...)
	}

	for i, w := range want {
		if strings.Contains(w, "%s") {
			want[i] = fmt.Sprintf(w, uuid)
		}
	}

	for _, l := range seen {
		require.False(t, bc.noDHCP && strings.HasPrefix(l, "DHCP "), "the edge's ProxyDHCP answered (%q) though it should answer nobody", l)
		require.False(t, strings.HasPrefix(l, "DHCP "+strangerMAC), "the edge answered the unregistered machine: %q", l)
		require.False(t, bc.noTFTP && strings.HasPrefix(l, "TFTP "), "the edge served a TFTP file (%q) at a site without TFTP", l)
	}

	require.Subset(t, seen, want, "edge saw %q", seen)

	logHas := bc.logHas
	if bc.stranger {
		// The unregistered machine asked, and was dropped as unknown (the edge's debug log names it), while the
		// registered one booted.
		logHas = append(logHas, []string{`"reason":"unknown_machine"`, `"mac":"` + strangerMAC + `"`})
	}

	edgeLog := filepath.Join(site.Dir, "edge.log")

	for _, frags := range logHas {
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(edgeLog)

			return err == nil && slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
				return !slices.ContainsFunc(frags, func(f string) bool { return !strings.Contains(l, f) })
			})
		}, time.Minute, time.Second, "no line with %q in %s", frags, edgeLog)
	}

	if bc.check != nil {
		bc.check(t, seen, site.Dir)
	}
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

// waitSerial waits, with a hard deadline, for the serial console file to hold marker, and returns the edge's
// lines printed meanwhile.
func waitSerial(t *testing.T, lines <-chan string, serial, marker string, timeout time.Duration) []string {
	t.Helper()

	deadline := time.After(timeout)
	tick := time.NewTicker(500 * time.Millisecond)

	defer tick.Stop()

	var seen []string

	for {
		select {
		case l := <-lines:
			seen = append(seen, l)
		case <-tick.C:
			if b, err := os.ReadFile(serial); err == nil && strings.Contains(string(b), marker) {
				// What the edge printed up to now, without waiting for more.
				for {
					select {
					case l := <-lines:
						seen = append(seen, l)
					default:
						return seen
					}
				}
			}
		case <-deadline:
			t.Fatalf("no %q on the serial console within %s; edge printed %q", marker, timeout, seen)
		}
	}
}

// bareFiles lays out the bare-dnsmasq peer's directory (SiteOptions.Bare) under dir: Debian's iPXE (the edge's,
// from ipxeDir), the agent's kernel and initramfs, and a boot.ipxe booting them with the same callback.
func bareFiles(t *testing.T, dir, ipxeDir, agentDir string) string {
	t.Helper()

	root := filepath.Join(dir, "bare")
	require.NoError(t, os.MkdirAll(root, 0o755))

	for src, name := range map[string]string{
		filepath.Join(ipxeDir, "undionly.kpxe"): "undionly.kpxe", filepath.Join(ipxeDir, "ipxe.efi"): "ipxe.efi",
		filepath.Join(agentDir, "vmlinuz"): "vmlinuz", filepath.Join(agentDir, "initramfs.xz"): "initramfs.xz",
	} {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(root, name), b, 0o644))
	}

	script := "#!ipxe\nkernel http://" + bootlab.DHCPIP + "/vmlinuz initrd=initrd console=ttyS0 talos.config=http://" + bootlab.DHCPIP +
		"/config?u=${uuid}\ninitrd --name initrd http://" + bootlab.DHCPIP + "/initramfs.xz\nboot\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, "boot.ipxe"), []byte(script), 0o644))

	return root
}
