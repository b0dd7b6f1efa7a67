package lab

import (
	"compress/gzip"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/siderolabs/omni/client/api/omni/specs"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/metalagent"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// AgentKind is the agent a machine runs in agent mode.
type AgentKind string

// Agent kinds.
const (
	// TestAgent is qemu/testagent inside the lab's /init (the default).
	TestAgent AgentKind = ""
	// RealAgent is the real talos-metal-agent (metalagent.Version) on the qemu/machined stand-in, setting its
	// BMC user in-band through a KCS interface (QEMU's isa-ipmi-kcs + ipmi-bmc-extern, served by the virtual
	// BMC). It needs the agent images (BuildAgentImages) at its site.
	RealAgent AgentKind = "real"
)

// AgentBMCUser is the BMC user the controller has the agent create (its default IPMI user name; the lab's
// controller keeps the default).
const AgentBMCUser = "outpost"

// AgentModules are the kernel modules a real-agent machine loads besides InitModules: the KCS system
// interface driver and the /dev/ipmi0 character device the agent opens.
var AgentModules = []string{"ipmi_si", "ipmi_devintf"}

// realAgentOEM is the SMBIOS OEM string that makes the lab's /init run the real agent (qemu/labinit);
// guestFaultsOEM is the key of the one that lists its guest faults.
const (
	realAgentOEM   = "outpost.agent=real"
	guestFaultsOEM = "outpost.faults"
)

// agentArgs are the QEMU arguments a machine gets for its agent: none for the test agent; for the real one
// the OEM string that chooses it and the in-band IPMI interface to its BMC.
func (m *Machine) agentArgs() []string {
	if m.Spec.Agent != RealAgent {
		return nil
	}

	args := []string{
		"-smbios", "type=11,value=" + realAgentOEM,
		"-chardev", "socket,id=ipmi0,path=" + m.ipmiSockPath() + ",reconnect=1",
		"-device", "ipmi-bmc-extern,id=bmc0,chardev=ipmi0",
		"-device", "isa-ipmi-kcs,bmc=bmc0",
	}

	if m.Spec.GuestFaults != "" {
		// QEMU's option syntax doubles a comma inside a value.
		args = append(args, "-smbios", "type=11,value="+guestFaultsOEM+"="+strings.ReplaceAll(m.Spec.GuestFaults, ",", ",,"))
	}

	return args
}

// RefuseInBandUsers makes the machine's BMC refuse the next n in-band password sets: the agent cannot create
// its BMC user until they are used up.
func (m *Machine) RefuseInBandUsers(n int) { m.ipmi.RefuseInBandUsers(n) }

// InBandUsersRefused returns how many in-band password sets the machine's BMC refused.
func (m *Machine) InBandUsersRefused() int64 { return m.ipmi.InBandUsersRefused() }

func (m *Machine) ipmiSockPath() string { return filepath.Join(m.Site.Dir, m.Spec.Name+".ipmi.sock") }

// serveInBand serves a real-agent machine's in-band IPMI (QEMU's external-BMC protocol) on its socket, on the
// same BMC as its LAN front end, which reports the machine's BMC address and port.
func (m *Machine) serveInBand(ctx context.Context) error {
	if m.Spec.Agent != RealAgent {
		return nil
	}

	if err := m.ipmi.SetLANAddress(ctx, netip.MustParseAddr(m.BMCAddress), IPMIPort); err != nil {
		return err
	}

	os.Remove(m.ipmiSockPath()) //nolint:errcheck

	ln, err := net.Listen("unix", m.ipmiSockPath())
	if err != nil {
		return fmt.Errorf("listen in-band ipmi of %s: %w", m.Spec.Name, err)
	}

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})

	go func() {
		defer close(done)

		if err := m.ipmi.ServeInBand(ctx, ln); err != nil {
			m.log.Warn("in-band ipmi ended", errField(err))
		}
	}()

	m.lab.Defer(func() { cancel(); <-done })

	return nil
}

// BMCHasUser reports whether the machine's BMC holds an enabled user of that name allowed on its LAN channel,
// read from the BMC itself (however it was created).
func (m *Machine) BMCHasUser(name string) bool { return m.ipmi.LANUser(name) }

// BuildRealAgent builds the real talos-metal-agent (cached under root/_out/metalagent).
func BuildRealAgent(ctx context.Context, root string) (string, error) {
	return metalagent.Build(ctx, metalagent.BuildOptions{RepoRoot: root})
}

// genericKernelPackage is the Debian kernel flavour with the IPMI drivers (the cloud flavour the other lab
// images boot has none).
const genericKernelFlavour = "amd64"

// EnsureGenericKernel finds Debian's generic amd64 kernel under outDir or fetches it with `apt-get download`
// (the version of linux-image-amd64) and unpacks it with `dpkg-deb -x`; bootlab.ErrNoKernel (wrapped) when
// that is impossible.
func EnsureGenericKernel(outDir string) (bootlab.Kernel, error) {
	root := filepath.Join(outDir, "root")

	find := func() (bootlab.Kernel, bool) {
		vmlinuz, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*-"+genericKernelFlavour))
		mods, _ := filepath.Glob(filepath.Join(root, "lib", "modules", "*-"+genericKernelFlavour))

		if len(vmlinuz) == 0 || len(mods) == 0 {
			return bootlab.Kernel{}, false
		}

		sort.Strings(vmlinuz)
		sort.Strings(mods)

		return bootlab.Kernel{Vmlinuz: vmlinuz[len(vmlinuz)-1], ModulesDir: mods[len(mods)-1]}, true
	}

	if k, ok := find(); ok {
		return k, nil
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return bootlab.Kernel{}, err
	}

	debs, _ := filepath.Glob(filepath.Join(outDir, "linux-image-*-"+genericKernelFlavour+"_*.deb"))
	if len(debs) == 0 {
		out, err := exec.Command("apt-cache", "depends", "linux-image-"+genericKernelFlavour).Output()
		if err != nil {
			return bootlab.Kernel{}, fmt.Errorf("apt-cache depends: %w: %w", err, bootlab.ErrNoKernel)
		}

		var pkg string

		for _, line := range strings.Split(string(out), "\n") {
			if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
				pkg = dep

				break
			}
		}

		if pkg == "" {
			return bootlab.Kernel{}, fmt.Errorf("no linux-image dependency in %q: %w", out, bootlab.ErrNoKernel)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()

		cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
		cmd.Dir = outDir

		if b, err := cmd.CombinedOutput(); err != nil {
			return bootlab.Kernel{}, fmt.Errorf("apt-get download %s: %w: %s: %w", pkg, err, b, bootlab.ErrNoKernel)
		}

		debs, _ = filepath.Glob(filepath.Join(outDir, "linux-image-*-"+genericKernelFlavour+"_*.deb"))
		if len(debs) == 0 {
			return bootlab.Kernel{}, fmt.Errorf("apt-get download left no .deb: %w", bootlab.ErrNoKernel)
		}
	}

	if b, err := exec.Command("dpkg-deb", "-x", debs[len(debs)-1], root).CombinedOutput(); err != nil {
		return bootlab.Kernel{}, fmt.Errorf("dpkg-deb -x: %w: %s: %w", err, b, bootlab.ErrNoKernel)
	}

	if k, ok := find(); ok {
		return k, nil
	}

	return bootlab.Kernel{}, fmt.Errorf("unpacked package holds no generic kernel: %w", bootlab.ErrNoKernel)
}

// BuildAgentImages builds the lab's boot images for machines that may run the real agent, into dir: Debian's
// generic kernel (cached under root/_out/realagent/kernel) and an initramfs whose /init is qemu/labinit with
// InitModules, followed by a second archive with the agent binary at /usr/bin/talos-metal-agent and AgentModules
// listed in /agent/modules.order (the kernel unpacks concatenated archives in turn). Machines without
// RealAgent boot the same images and run the test agent.
func BuildAgentImages(ctx context.Context, root, dir, agentBin string) (Images, error) {
	kernel, err := EnsureGenericKernel(filepath.Join(root, "_out", "realagent", "kernel"))
	if err != nil {
		return Images{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	initBin := filepath.Join(dir, "labinit")
	if err := GoBuild(ctx, root, "./qemu/labinit", initBin); err != nil {
		return Images{}, err
	}

	initData, err := os.ReadFile(initBin)
	if err != nil {
		return Images{}, err
	}

	agent, err := os.ReadFile(agentBin)
	if err != nil {
		return Images{}, fmt.Errorf("read the metal agent: %w", err)
	}

	img := Images{AssetsDir: filepath.Join(dir, "assets")}

	for _, sub := range []string{"agent", "install"} {
		d := filepath.Join(img.AssetsDir, sub, "x86_64")
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Images{}, err
		}

		if err := copyFile(kernel.Vmlinuz, filepath.Join(d, "vmlinuz")); err != nil {
			return Images{}, err
		}

		if err := writeAgentInitramfs(filepath.Join(d, "initramfs.xz"), initData, agent, kernel.ModulesDir); err != nil {
			return Images{}, err
		}
	}

	img.Kernel = filepath.Join(img.AssetsDir, "agent", "x86_64", "vmlinuz")
	img.Initramfs = filepath.Join(img.AssetsDir, "agent", "x86_64", "initramfs.xz")

	return img, nil
}

func writeAgentInitramfs(path string, initData, agent []byte, modulesDir string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}

	if err := bootlab.BuildInitramfs(f, initData, modulesDir, InitModules); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("build initramfs: %w", err)
	}

	if err := appendAgentArchive(f, agent, modulesDir); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("build the agent's initramfs archive: %w", err)
	}

	return f.Close()
}

// appendAgentArchive writes the second, gzip-compressed cpio archive: the agent and its modules.
func appendAgentArchive(f *os.File, agent []byte, modulesDir string) error {
	order, err := bootlab.ModuleDeps(modulesDir, AgentModules)
	if err != nil {
		return err
	}

	gz := gzip.NewWriter(f)
	c := bootlab.NewCPIOWriter(gz)

	for _, d := range []string{"usr", "usr/bin", "agent"} {
		c.Dir(d)
	}

	c.File("usr/bin/talos-metal-agent", 0o755, agent)

	dirs := map[string]bool{}

	var list strings.Builder

	for _, mod := range order {
		var parents []string
		for p := filepath.Dir(filepath.Join("lib/modules", mod)); p != "." && !dirs[p]; p = filepath.Dir(p) {
			parents = append(parents, p)
			dirs[p] = true
		}

		sort.Strings(parents)

		for _, p := range parents {
			c.Dir(p)
		}

		data, err := os.ReadFile(filepath.Join(modulesDir, mod))
		if err != nil {
			return fmt.Errorf("read module %s: %w", mod, err)
		}

		c.File(filepath.Join("lib/modules", mod), 0o644, data)
		list.WriteString("/" + filepath.Join("lib/modules", mod) + "\n")
	}

	c.File("agent/modules.order", 0o644, []byte(list.String()))

	if err := c.Close(); err != nil {
		return err
	}

	return gz.Close()
}

// RealAgentOptions configure SetupRealAgent.
type RealAgentOptions struct {
	// Omni is the lab's Omni (default RealOmni).
	Omni OmniMode
	// WipeTimeout replaces the controller's one-hour bound of a fast wipe.
	WipeTimeout time.Duration
}

// SetupRealAgent brings up the core, Omni (real or stand-in), the controller with the lab's local install
// assets and one site (site1) with its edge serving images (BuildAgentImages); no machine is added.
func SetupRealAgent(ctx context.Context, l *Lab, bins Binaries, images Images, opts RealAgentOptions) (*Env, error) {
	if opts.Omni == "" {
		opts.Omni = RealOmni
	}

	e := &Env{
		Lab: l, Timeline: NewTimeline(filepath.Join(l.Dir, "timeline.md")), edgeBin: bins.Edge,
		opts: Options{Omni: opts.Omni}, zeroes: map[*Site]bool{},
	}

	var err error

	if e.Core, err = l.AddCore(); err != nil {
		return nil, err
	}

	start := time.Now()

	switch opts.Omni {
	case RealOmni:
		e.Omni, err = l.StartRealOmni(ctx, e.Core, bins.RealOmni)
		e.Timeline.Step("real Omni "+realomni.Version+" started, infra provider created", "", start, err)
	default:
		e.Omni, err = l.StartStandIn(ctx, e.Core, bins.StandIn)
	}

	if err != nil {
		return nil, err
	}

	local := filepath.Join(l.Dir, "local-assets")
	if err := LocalAssets(images, local); err != nil {
		return nil, err
	}

	e.preseed = filepath.Join(l.Dir, "edge-preseed")
	if err := PreseedBundle(images, local, e.preseed); err != nil {
		return nil, err
	}

	e.ctrlBin, e.ctrlOpts = bins.Controller, ControllerOptions{LocalAssetsDir: local, PowerCooldown: labCooldown, WipeTimeout: opts.WipeTimeout}
	if e.Controller, err = l.StartController(ctx, e.Core, e.ctrlBin, e.Omni, e.ctrlOpts); err != nil {
		return nil, err
	}

	site, err := l.AddSite(e.Core, 1)
	if err != nil {
		return nil, err
	}

	token, err := e.Controller.CreateSite(ctx, site.Name)
	if err != nil {
		return nil, err
	}

	edge, err := site.StartEdge(ctx, bins.Edge, EdgeOptions{Token: token, PreseedDir: e.preseed})
	if err != nil {
		return nil, err
	}

	e.Sites, e.Edges, e.tokens = append(e.Sites, site), append(e.Edges, edge), append(e.tokens, token)

	return e, nil
}

// AddMachine adds a machine to the site (powered off) and to the lab's machines; installs it reports are
// counted as the scenario counts them.
func (e *Env) AddMachine(ctx context.Context, site *Site, spec MachineSpec) (*Machine, error) {
	m, err := site.AddMachine(ctx, spec)
	if err != nil {
		return nil, err
	}

	m.OnInstalled = e.reportInstalled
	e.Machines = append(e.Machines, m)

	return m, nil
}

// WaitPending waits until Omni lists the machine, waiting for acceptance: its agent's tunnel reached the edge
// and the controller created it.
func (e *Env) WaitPending(ctx context.Context, m *Machine, timeout time.Duration) error {
	return poll(ctx, timeout, "pending InfraMachine", m, func() (bool, error) {
		spec, _, err := e.infraMachine(ctx, m.Spec.UUID)

		return spec != nil && spec.AcceptanceStatus == specs.InfraMachineConfigSpec_PENDING, err
	})
}

// WaitReadyToUse waits until Omni reports the machine ready to use (its BMC configured, its disk wiped).
func (e *Env) WaitReadyToUse(ctx context.Context, m *Machine, timeout time.Duration) error {
	return poll(ctx, timeout, "ready to use in Omni", m, func() (bool, error) { return e.ReadyToUse(ctx, m) })
}

// ReadyToUse reads whether Omni reports m ready to use now.
func (e *Env) ReadyToUse(ctx context.Context, m *Machine) (bool, error) {
	_, st, err := e.infraMachine(ctx, m.Spec.UUID)

	return st != nil && st.ReadyToUse, err
}

// WaitBMCUser waits until the machine's BMC holds an enabled LAN user of that name (BMCHasUser).
func (m *Machine) WaitBMCUser(ctx context.Context, name string, timeout time.Duration) error {
	return poll(ctx, timeout, "bmc user "+name+" on the LAN channel", m, func() (bool, error) {
		return m.BMCHasUser(name), nil
	})
}
