package bootlab_test

import (
	"cmp"
	"context"
	"fmt"
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

// aavmfPXECase is the AAVMF PXE boot (the firmware matrix's AAVMF-PXE row, arm64Matrix): an arm64 machine
// (QEMU virt, Cortex-A57 with 512 MiB under TCG, Debian's AAVMF) DHCPs as UEFI arm64 (option 93 = 11), fetches
// the edge's arm64 iPXE (Debian's, hack/ipxe.sh) over TFTP, that iPXE fetches the boot script, and the script boots
// the arm64 agent kernel and initramfs (Debian's arm64 cloud kernel, hack/kernel-arm64.sh; the lab's init
// cross-compiled) from /assets/agent/arm64 with the arm64 console.
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

	l := a.startLabSite(t, bootlab.NewSite(t, bootlab.SiteOptions{}), nil)
	m := a.newMachine(t, l)
	start := time.Now()
	serial, _ := a.startMachine(t, l.site, "aavmf", m, "")

	t.Cleanup(func() { logSerialOnFailure(t, serial) })

	seen := waitLine(t, l.lines, "TFTP snp-arm64.efi", 10*time.Minute)
	require.Contains(t, seen, "DHCP "+arm64MAC+" uefi-arm64 ipxe=false", "the firmware's DHCP was not classified UEFI arm64")

	edgeLog := filepath.Join(l.site.Dir, "edge.log")
	require.Eventually(t, func() bool {
		return logHasLine(edgeLog, `"reason":"no_agent_assets_for_arch"`, `"arch":"arm64"`, `"uuid":"`+m.uuid+`"`)
	}, 10*time.Minute, time.Second, "the edge never refused the arm64 machine by name (%s)", edgeLog)

	t.Logf("aavmf-pxe without arm64 assets: power-on to the named refusal in %s", time.Since(start).Round(100*time.Millisecond))

	b, err := os.ReadFile(edgeLog)
	require.NoError(t, err)
	require.NotContains(t, string(b), `"uri":"/assets/`, "the edge served an asset to the refused machine")
	require.NotContains(t, drain(l.lines), "BOOT "+m.uuid+" agent platform=efi", "the edge served a boot to the refused machine")
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

	a.ipxeDir = bootlab.IPXEFor(t)
	a.edgeBin = bootlab.GoBuild(t, a.root, "./qemu/bootlab/labedge", filepath.Join(a.dir, "labedge"))

	return a
}

// kernelFiles returns Debian's arm64 cloud kernel, its modules directory and the arm64 UKI stub
// (hack/kernel-arm64.sh), or skips the test where they cannot be had.
func (a arm64Lab) kernelFiles(t *testing.T) (vmlinuz, modules, stub string) {
	t.Helper()

	kroot, err := bootlab.Hack(context.Background(), a.root, "kernel-arm64.sh")
	if err != nil {
		t.Skipf("lab test: no arm64 kernel (%v)", err)
	}

	k, _ := filepath.Glob(filepath.Join(kroot, "boot", "vmlinuz-*-cloud-arm64"))
	mods, _ := filepath.Glob(filepath.Join(kroot, "lib", "modules", "*-cloud-arm64"))
	require.NotEmpty(t, k, "no arm64 kernel under %s", kroot)
	require.NotEmpty(t, mods, "no arm64 modules under %s", kroot)

	return k[len(k)-1], mods[len(mods)-1], filepath.Join(kroot, "usr", "lib", "systemd", "boot", "efi", "linuxaa64.efi.stub")
}

// agentAssets puts the arm64 agent kernel (Debian's arm64 cloud kernel) and an initramfs of the lab's init
// cross-compiled for arm64 with the kernel's virtio modules under assets/agent/arm64, and the same two under
// assets/install/arm64 (the lab's /init is the installer when its command line says so).
func (a arm64Lab) agentAssets(t *testing.T) {
	t.Helper()

	vmlinuz, modules, _ := a.kernelFiles(t)

	agentDir := filepath.Join(a.dir, "assets", "agent", "arm64")
	require.NoError(t, os.MkdirAll(agentDir, 0o755))

	b, err := os.ReadFile(vmlinuz)
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
	require.NoError(t, bootlab.BuildInitramfs(initrd, initData, modules, []string{"virtio_pci", "virtio_net", "virtio_rng", "virtio_blk"}))
	require.NoError(t, initrd.Close())

	installDir := filepath.Join(a.dir, "assets", "install", "arm64")
	require.NoError(t, os.MkdirAll(installDir, 0o755))

	for _, name := range []string{"vmlinuz", "initramfs.xz"} {
		require.NoError(t, os.Link(filepath.Join(agentDir, name), filepath.Join(installDir, name)))
	}
}

// newMachine returns an arm64 machine with a fresh UUID, its own tap on the site and its own copy of AAVMF's
// variables, without a disk.
func (a arm64Lab) newMachine(t *testing.T, l *labSite) *machine {
	t.Helper()

	m := &machine{uuid: randomUUID(t), tap: l.site.AddTap(t), vars: filepath.Join(a.dir, "AAVMF_VARS.fd")}
	aavmfVarsTo(t, m.vars)

	return m
}

// aavmfVarsTo writes a fresh copy of AAVMF's variable store (the firmware writes it) to path.
func aavmfVarsTo(t *testing.T, path string) {
	t.Helper()

	b, err := os.ReadFile(aavmfVars)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// startMachine powers on the arm64 machine (firmware aavmf: PXE; aavmf-http: UEFI HTTP boot only; the NIC
// first, then its disk when it has one) and returns its serial console's file and its QEMU.
func (a arm64Lab) startMachine(t *testing.T, site *bootlab.Site, firmware string, m *machine, step string) (string, *exec.Cmd) {
	t.Helper()

	serial := filepath.Join(site.Dir, "serial-"+firmware+".log")
	if step != "" {
		serial = filepath.Join(site.Dir, "serial-"+firmware+"-"+step+".log")
	}

	args := []string{"netns", "exec", site.MachineNS(), "qemu-system-aarch64",
		"-machine", "virt,accel=tcg", "-cpu", "cortex-a57", "-m", "512", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:" + serial,
		"-smbios", "type=1,uuid=" + m.uuid,
		"-drive", "if=pflash,format=raw,readonly=on,file=" + aavmfCode,
		"-drive", "if=pflash,format=raw,file=" + m.vars,
		"-netdev", "tap,id=n0,ifname=" + m.tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + arm64MAC + ",romfile=,bootindex=0",
		// Entropy for the guest: without it getrandom blocks and the /init cannot even pick a DHCP xid.
		"-device", "virtio-rng-pci"}

	if m.disk != "" {
		args = append(args, "-drive", "if=none,id=d0,format=raw,file="+m.disk, "-device", "virtio-blk-pci,drive=d0,bootindex=1")
	}

	if firmware == "aavmf-http" {
		// As OVMF's: the fw_cfg knobs turn the firmware's PXE off, so it boots the NIC by HTTP boot (IPv4) only.
		args = append(args, "-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
			"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
	}

	return serial, site.Start(t, "qemu-"+firmware+step, nil, "ip", args...)
}

// boot powers the arm64 machine on through the edge, waits for what bc's step ends with (the callback, or
// bc.serial on the serial console; with bc.powerOff, the machine powering off too), checks the edge's chain
// for the firmware and step, and returns the time from power-on to the step's end.
func (a arm64Lab) boot(t *testing.T, l *labSite, bc bootCase, m *machine) time.Duration {
	t.Helper()

	drain(l.lines) // what the edge printed for an earlier boot is not this one's

	start := time.Now()
	serial, qemu := a.startMachine(t, l.site, bc.firmware, m, bc.step)

	t.Cleanup(func() { logSerialOnFailure(t, serial) })

	var seen []string
	if bc.serial != "" {
		seen = waitSerial(t, l.lines, serial, bc.serial, bc.timeout)
	} else {
		seen = waitLine(t, l.lines, "CALLBACK u="+m.uuid, bc.timeout)
	}

	took := time.Since(start).Round(100 * time.Millisecond)
	t.Logf("%s %s: power-on to the step's end in %s", bc.firmware, cmp.Or(bc.step, "agent"), took)

	if bc.powerOff {
		select {
		case <-l.site.Exited(qemu):
		case <-time.After(time.Minute):
			t.Fatalf("the machine did not power off within a minute of %s", took)
		}
	}

	if bc.want == nil {
		// The edge reports a machine's DHCP requests once, at its first boot (the agent step).
		first := bc.step == ""

		switch {
		case bc.firmware == "aavmf-http" && first:
			bc.want = []string{"DHCP " + arm64MAC + " http-arm64 ipxe=false", "DHCP " + arm64MAC + " uefi-arm64 ipxe=true"}
		case first:
			bc.want = []string{"DHCP " + arm64MAC + " uefi-arm64 ipxe=false", "TFTP snp-arm64.efi", "DHCP " + arm64MAC + " uefi-arm64 ipxe=true"}
		case bc.firmware == "aavmf":
			bc.want = []string{"TFTP snp-arm64.efi"}
		}

		bc.want = append(bc.want, "BOOT %s "+cmp.Or(bc.step, "agent")+" platform=efi")
	}

	checkEdge(t, bc, m.uuid, seen, l.site)

	if bc.step == "" {
		b, err := os.ReadFile(serial)
		require.NoError(t, err)
		require.Contains(t, string(b), "console=ttyAMA0", "the arm64 kernel was not given its serial console")
	}

	return took
}

// bareBoot boots a new arm64 machine from the bare-dnsmasq peer (SiteOptions.Bare: dnsmasq + static files, no
// edge) with the same iPXE, kernel and initramfs, and returns its power-on to callback time.
func (a arm64Lab) bareBoot(t *testing.T, firmware string) time.Duration {
	t.Helper()

	root := filepath.Join(a.dir, "bare-"+firmware)
	require.NoError(t, os.MkdirAll(root, 0o755))

	for src, name := range map[string]string{
		filepath.Join(a.ipxeDir, "snp-arm64.efi"):                        "snp-arm64.efi",
		filepath.Join(a.dir, "assets", "agent", "arm64", "vmlinuz"):      "vmlinuz",
		filepath.Join(a.dir, "assets", "agent", "arm64", "initramfs.xz"): "initramfs.xz",
	} {
		require.NoError(t, os.Link(src, filepath.Join(root, name)))
	}

	script := "#!ipxe\nkernel http://" + bootlab.DHCPIP + "/vmlinuz initrd=initrd console=ttyAMA0 talos.config=http://" + bootlab.DHCPIP +
		"/config?u=${uuid}\ninitrd --name initrd http://" + bootlab.DHCPIP + "/initramfs.xz\nboot\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, "boot.ipxe"), []byte(script), 0o644))

	site := bootlab.NewSite(t, bootlab.SiteOptions{Bare: root})
	m := &machine{uuid: randomUUID(t), tap: site.AddTap(t), vars: filepath.Join(a.dir, "AAVMF_VARS-bare-"+firmware+".fd")}
	aavmfVarsTo(t, m.vars)

	start := time.Now()
	serial, _ := a.startMachine(t, site, firmware, m, "")

	t.Cleanup(func() { logSerialOnFailure(t, serial) })

	// The bare peer prints nothing: the machine's /init says on its console that it called back.
	waitSerial(t, make(chan string), serial, "OUTPOST-CALLBACK-DONE", 10*time.Minute)

	took := time.Since(start).Round(100 * time.Millisecond)
	t.Logf("%s (bare dnsmasq): power-on to callback in %s", firmware, took)

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

// arm64Matrix runs the firmware matrix's arm64 rows (AAVMF-PXE, AAVMF-HTTPBoot) as TestFirmwareMatrix runs the
// x86 ones: one site and edge per row, one machine kept across its steps (agent, install, disk), each step run
// only when the one before it passed; logCell logs each cell's line, the agent cell's beside the bare-dnsmasq
// peer's time (bareBoot).
func arm64Matrix(t *testing.T, logCell func(line string)) {
	for _, row := range []struct {
		firmware string
		bc       func() bootCase
	}{
		{"AAVMF-PXE", aavmfPXECase},
		{"AAVMF-HTTPBoot", aavmfHTTPBootCase},
	} {
		t.Run(row.firmware, func(t *testing.T) {
			agent := row.bc()
			a := newArm64Lab(t)
			a.agentAssets(t)
			image := a.diskImage(t)

			site := bootlab.NewSite(t, agent.site)
			l := a.startLabSite(t, site, agent.edgeArgs)
			m := l.newMachine(t, agent.firmware, 64<<20)
			aavmfVarsTo(t, m.vars) // newMachine copies OVMF's

			var failed string

			for _, step := range []struct {
				name string
				run  func(t *testing.T) time.Duration
			}{
				{"agent", func(t *testing.T) time.Duration { return a.boot(t, l, agent, m) }},
				{"install", func(t *testing.T) time.Duration {
					l.setPlan(t, m.uuid+" install "+image+" arm64")

					bc := stepCase(agent, "install")
					bc.serial, bc.powerOff = "OUTPOST-INSTALL-DONE", true

					return a.boot(t, l, bc, m)
				}},
				{"disk", func(t *testing.T) time.Duration {
					l.setPlan(t, m.uuid+" disk http-404")

					bc := stepCase(agent, "disk")
					bc.serial = diskMarker

					return a.boot(t, l, bc, m)
				}},
			} {
				ok := t.Run(step.name, func(t *testing.T) {
					if failed != "" {
						t.Skipf("not run: step %s of this machine's life failed", failed)
					}

					line := fmt.Sprintf("%-16s %-8s edge %6s", row.firmware, step.name, step.run(t))
					if step.name == "agent" && !t.Failed() {
						line += fmt.Sprintf("  bare dnsmasq %6s", a.bareBoot(t, agent.firmware))
					}

					logCell(line)
				})
				if !ok && failed == "" {
					failed = step.name
				}
			}
		})
	}
}

// diskImage writes the arm64 machine's disk image into the edge's assets and returns its asset name: a GPT disk
// whose EFI system partition holds, as EFI/BOOT/BOOTAA64.EFI, an arm64 UKI (systemd-boot-efi:arm64's stub,
// the arm64 kernel, the agent's initramfs, whose /init prints diskMarker for outpost.lab.disk=1).
func (a arm64Lab) diskImage(t *testing.T) string {
	t.Helper()

	const name = "lab/disk-arm64.img"

	kernel, _, stub := a.kernelFiles(t)

	// The aarch64 objcopy (the host's cannot write an arm64 PE); the arm64 kernel is an uncompressed Image
	// (27 MiB), so the initrd lies past 64 MiB.
	uki := filepath.Join(t.TempDir(), "uki.efi")
	require.NoError(t, bootlab.BuildUKI(t.Context(), t.TempDir(), bootlab.UKI{
		Kernel: kernel, Initrd: filepath.Join(a.dir, "assets", "agent", "arm64", "initramfs.xz"), Cmdline: "console=ttyAMA0 outpost.lab.disk=1",
		Stub: stub, Objcopy: "aarch64-linux-gnu-objcopy", InitrdVMA: "0x4000000",
	}, uki))

	out := filepath.Join(a.dir, "assets", filepath.FromSlash(name))
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))
	writeESPImage(t, out, uki)

	return name
}

// startLabSite starts the edge with a plan file (labedge -plan-file) and returns the site as the matrix's
// steps use it (labSite.setPlan, newMachine).
func (a arm64Lab) startLabSite(t *testing.T, site *bootlab.Site, args []string) *labSite {
	t.Helper()

	l := &labSite{dir: a.dir, site: site, lines: make(chan string, 64), planFile: filepath.Join(a.dir, "plans")}
	require.NoError(t, os.WriteFile(l.planFile, nil, 0o644))

	l.edge = site.Start(t, "edge", l.lines, "ip", append([]string{"netns", "exec", site.NS, a.edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(a.dir, "state"), "-assets", filepath.Join(a.dir, "assets"),
		"-log-level", "debug", "-ipxe-dir", a.ipxeDir, "-plan-file", l.planFile}, args...)...)
	waitLine(t, l.lines, "READY", 30*time.Second)

	return l
}
