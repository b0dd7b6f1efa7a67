package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// FactoryAddr is the image factory's address in the core namespace as the controller is given it (on the
// core's loopback beside CoreAddr). Air-gapped sites have no route to it: they route CoreAddr only.
const FactoryAddr = "10.99.0.3"

// ServeFactory serves f (a real Omni's own fake factory, or one of the test's) in the core namespace on
// FactoryAddr until the lab closes, and returns its URL (http://FactoryAddr:port). The factory keeps one
// state and counts this listener's requests apart (realomni.Factory.RequestsOn with the URL's host).
func (l *Lab) ServeFactory(core *Core, f *realomni.Factory) (string, error) {
	if err := l.IP("-n", core.NS, "addr", "add", FactoryAddr+"/32", "dev", "lo"); err != nil {
		return "", err
	}

	var ln net.Listener

	if err := InNetns(core.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", FactoryAddr+":0")

		return err
	}); err != nil {
		return "", fmt.Errorf("listen for the image factory in %s: %w", core.NS, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- f.Serve(ctx, ln) }()

	l.Defer(func() {
		cancel()

		if err := <-done; err != nil {
			l.log.Warn("image factory on " + FactoryAddr + ": " + err.Error())
		}
	})

	return "http://" + ln.Addr().String(), nil
}

// AddAirGappedSite creates site number index like AddSite, but its namespace (the edge's, and the router of
// its machines) routes nothing but the core's service address CoreAddr over its WAN: the controller's
// uplink, and Omni, which the lab runs on the same address. No default route: the image factory on
// FactoryAddr, or anything else, is unreachable from the site.
func (l *Lab) AddAirGappedSite(core *Core, index int) (*Site, error) {
	s, err := l.AddSite(core, index)
	if err != nil {
		return nil, err
	}

	for _, args := range [][]string{
		{"-n", s.NS, "route", "del", "default"},
		{"-n", s.NS, "route", "add", CoreAddr + "/32", "via", s.coreWanIP()},
	} {
		if err := l.IP(args...); err != nil {
			return nil, err
		}
	}

	s.airGapped = true

	return s, nil
}

// Routes returns the site namespace's IPv4 routing table (`ip route show`).
func (s *Site) Routes() (string, error) {
	out, err := exec.Command("ip", "-n", s.NS, "-4", "route", "show").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip -n %s route show: %w: %s", s.NS, err, out)
	}

	return string(out), nil
}

// SetPolicy sets a site's boot-asset policy (`controller site policy SITE passthrough|cache|offline`).
func (c *Controller) SetPolicy(ctx context.Context, site, policy string) error {
	_, err := c.site(ctx, "policy", site, policy)

	return err
}

// Command runs `controller <args> --state-dir <its state>` against the controller's admin socket, bounded by
// timeout, and returns its standard output; the error carries its standard error.
func (c *Controller) Command(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var stdout, stderr bytes.Buffer

	cmd := exec.CommandContext(ctx, c.Bin, append(args, "--state-dir", c.StateDir)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second

	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("controller %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}

	return stdout.String(), nil
}

// relayedRE is the line of `controller site show` that counts what was relayed to the site.
var relayedRE = regexp.MustCompile(`(?m)^relayed:\s+(\d+) bytes in (\d+) completed relays`)

// RelayedBytes returns the bytes the controller relayed to a site and the relays completed, as `controller
// site show` reports them (the site asset state's bytes_relayed and relays).
func (c *Controller) RelayedBytes(ctx context.Context, site string) (bytes, relays int64, err error) {
	show, err := c.SiteShow(ctx, site)
	if err != nil {
		return 0, 0, err
	}

	m := relayedRE.FindStringSubmatch(show)
	if m == nil {
		return 0, 0, fmt.Errorf("controller site show %s: no relayed line:\n%s", site, show)
	}

	bytes, _ = strconv.ParseInt(m[1], 10, 64)  //nolint:errcheck // the pattern is digits
	relays, _ = strconv.ParseInt(m[2], 10, 64) //nolint:errcheck

	return bytes, relays, nil
}

// EdgeMetric sums the samples of a metric the site's edge serves at /metrics (its HTTP port, read from inside
// the site) whose labels include every name=value pair of labels.
func (s *Site) EdgeMetric(ctx context.Context, name string, labels ...string) (float64, error) {
	c := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return DialerIn(s.NS)(ctx, addr)
		}, DisableKeepAlives: true},
		Timeout: 10 * time.Second,
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.EdgeIP()+"/metrics", nil)
	if err != nil {
		return 0, err
	}

	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("edge metrics of %s: %w", s.Name, err)
	}
	defer resp.Body.Close() //nolint:errcheck

	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, fmt.Errorf("edge metrics of %s: %w", s.Name, err)
	}

	return sumSamples(body, name, labels...), nil
}

// sumSamples sums the samples of metric name in a Prometheus text exposition whose labels include each
// name=value pair of labels.
func sumSamples(exposition []byte, name string, labels ...string) float64 {
	var sum float64

	for line := range strings.SplitSeq(string(exposition), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}

		set, value := "", rest
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}

			set, value = rest[1:end], rest[end+1:]
		}

		match := true

		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(","+set+",", ","+labels[i]+`="`+labels[i+1]+`",`) {
				match = false
			}
		}

		if !match {
			continue
		}

		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			sum += v
		}
	}

	return sum
}

// factoryMarker ends the /init of the factory's initramfs (after the ELF image, where it changes nothing).
const factoryMarker = "\n# outpost lab: install image served by the fake image factory\n"

// BuildFactoryInitramfs writes to out an initramfs like the lab's (BuildImages; root is the repository, where
// the guest kernel's modules are cached) whose /init has factoryMarker appended: it boots the same, and its
// bytes, hence its digest, are not the agent image's.
func BuildFactoryInitramfs(root string, images Images, out string) error {
	kernel, err := bootlab.EnsureKernel(filepath.Join(root, "_out", "bootlab"))
	if err != nil {
		return err
	}

	initData, err := os.ReadFile(filepath.Join(filepath.Dir(images.AssetsDir), "labinit"))
	if err != nil {
		return fmt.Errorf("factory initramfs: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}

	if err := bootlab.BuildInitramfs(f, append(initData, factoryMarker...), kernel.ModulesDir, InitModules); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("build factory initramfs: %w", err)
	}

	return f.Close()
}

// AirGap is the lab of the air-gapped install test: the core with Omni, the controller resolving installs
// through a fake image factory only it can reach, and sites whose networks route nothing but the core's
// service address. Its Env gives the lifecycle scenario's steps (discovery, acceptance, the install boot's
// checks) to the test.
type AirGap struct {
	*Env
	// Factory is the fake image factory (a real Omni's own, served a second time on FactoryAddr; with the
	// stand-in, the test's own).
	Factory *realomni.Factory
	// FactoryURL is where the controller reaches it; FactoryHost is its host:port (RequestsOn's key).
	FactoryURL, FactoryHost string
	// InstallInitramfs is the initramfs the factory serves (FactoryImages); its kernel is the lab's.
	InstallInitramfs string
}

// AirGapOptions configure SetupAirGap.
type AirGapOptions struct {
	// Omni is the lab's Omni (default RealOmni).
	Omni OmniMode
	// Policies are the sites to create, each air-gapped, with its asset policy (cache or offline), in order
	// (site1, site2, ...).
	Policies []string
	// RepoRoot is the repository (the guest kernel's modules are cached under it, BuildImages).
	RepoRoot string
}

// SetupAirGap brings up the core, Omni, the fake factory on FactoryAddr serving the lab's images as every
// schematic's kernel and initramfs, the controller with --image-factory-url (no local install assets; the
// agent images by --agent-assets-dir, relayed to every site) and one air-gapped site per policy with its
// edge running. No machine is added.
func SetupAirGap(ctx context.Context, l *Lab, bins Binaries, images Images, opts AirGapOptions) (*AirGap, error) {
	if opts.Omni == "" {
		opts.Omni = RealOmni
	}

	e := &Env{
		Lab: l, Timeline: NewTimeline(filepath.Join(l.Dir, "timeline.md")), edgeBin: bins.Edge,
		opts: Options{Omni: opts.Omni}, zeroes: map[*Site]bool{},
	}
	a := &AirGap{Env: e}

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

	if e.Omni.Real != nil {
		a.Factory = e.Omni.Real.Factory()
	} else {
		a.Factory = realomni.NewFactory(realomni.FactoryConfig{
			TalosVersions: realomni.DefaultTalosVersions, KubernetesVersions: realomni.DefaultKubernetesVersions, Logger: l.log,
		})
	}

	// The lab's machines boot one kernel and /init for everything; install mode is told apart by the kernel
	// command line (Images). The factory's initramfs differs from the agent image's, as a real factory's
	// install image differs from the agent's, so what the sites hold for installs must come from the factory.
	a.InstallInitramfs = filepath.Join(l.Dir, "factory-images", "initramfs-amd64.xz")
	if err := BuildFactoryInitramfs(opts.RepoRoot, images, a.InstallInitramfs); err != nil {
		return nil, err
	}

	a.Factory.SetImages("amd64", realomni.ImageFiles{Kernel: images.Kernel, Initramfs: a.InstallInitramfs})

	if a.FactoryURL, err = l.ServeFactory(e.Core, a.Factory); err != nil {
		return nil, err
	}

	a.FactoryHost = strings.TrimPrefix(a.FactoryURL, "http://")

	agentAssets := filepath.Join(l.Dir, "agent-assets")
	if err := AgentAssets(images, agentAssets); err != nil {
		return nil, err
	}

	e.ctrlBin = bins.Controller
	e.ctrlOpts = ControllerOptions{PowerCooldown: labCooldown, AgentAssetsDir: agentAssets, ImageFactoryURL: a.FactoryURL}

	if e.Controller, err = l.StartController(ctx, e.Core, e.ctrlBin, e.Omni, e.ctrlOpts); err != nil {
		return nil, err
	}

	for i, policy := range opts.Policies {
		site, err := l.AddAirGappedSite(e.Core, i+1)
		if err != nil {
			return nil, err
		}

		token, err := e.Controller.CreateSite(ctx, site.Name)
		if err != nil {
			return nil, err
		}

		if err := e.Controller.SetPolicy(ctx, site.Name, policy); err != nil {
			return nil, err
		}

		edge, err := site.StartEdge(ctx, bins.Edge, EdgeOptions{Token: token})
		if err != nil {
			return nil, err
		}

		e.Sites, e.Edges, e.tokens = append(e.Sites, site), append(e.Edges, edge), append(e.tokens, token)
	}

	return a, nil
}

// AddMachine adds a BIOS machine with an IPMI BMC to a site (powered off); its QEMU runs are bounded by 20
// minutes (an install boot may wait in iPXE for its assets).
func (a *AirGap) AddMachine(ctx context.Context, site *Site, name, uuid, mac string) (*Machine, error) {
	return a.AddMachineSpec(ctx, site, MachineSpec{Name: name, UUID: uuid, MAC: mac, Firmware: BIOS, BMC: IPMI})
}

// AddMachineSpec adds a machine as spec says to a site (powered off), as AddMachine does with its defaults
// (its QEMU runs bounded by 20 minutes unless spec says).
func (a *AirGap) AddMachineSpec(ctx context.Context, site *Site, spec MachineSpec) (*Machine, error) {
	if spec.RunTimeout == 0 {
		spec.RunTimeout = 20 * time.Minute
	}

	m, err := site.AddMachine(ctx, spec)
	if err != nil {
		return nil, err
	}

	m.OnInstalled = a.reportInstalled
	a.Machines = append(a.Machines, m)

	return m, nil
}

// Discover powers the machines on and takes them to ready in Omni: agent mode, pending, accepted, BMC user
// provisioned, disk wiped, ready (kept on by a real Omni, powered off by the stand-in's).
func (a *AirGap) Discover(ctx context.Context, ms ...*Machine) error {
	return a.discoverAndAccept(ctx, ms...)
}

// Allocate allocates the machine in Omni, as its cluster's one worker with Talos LabTalosVersion, and waits
// until Omni has done so.
func (a *AirGap) Allocate(ctx context.Context, m *Machine, cluster string) error {
	if err := a.Omni.Allocate(ctx, m.Spec.UUID, cluster); err != nil {
		return err
	}

	return poll(ctx, 2*time.Minute, "allocated in Omni with Talos "+LabTalosVersion, m, func() (bool, error) {
		spec, _, err := a.infraMachine(ctx, m.Spec.UUID)

		return spec != nil && spec.ClusterTalosVersion == LabTalosVersion, err
	})
}

// WaitInstalled waits, after serial offset from, for the machine's install boot (its kernel command line
// carrying talos.config at its edge), the install written to its disk (with the stand-in also counted by
// Omni) and the installed OS booted from disk without the network.
func (a *AirGap) WaitInstalled(ctx context.Context, m *Machine, from int64) error {
	if err := a.waitInstallBoot(ctx, m, from); err != nil {
		return err
	}

	if err := m.WaitSerial(ctx, from, "OUTPOST-INSTALL-WRITTEN", 3*time.Minute); err != nil {
		return err
	}

	if !a.real() {
		if err := poll(ctx, time.Minute, "installed in Omni", m, func() (bool, error) {
			_, st, err := a.infraMachine(ctx, m.Spec.UUID)

			return st != nil && st.Installed, err
		}); err != nil {
			return err
		}
	}

	return a.waitDiskBoot(ctx, m, from)
}

// InstallBooted reports whether the machine booted its install plan after serial offset from.
func InstallBooted(m *Machine, from int64) bool {
	return m.Serial.Contains(from, "OUTPOST-INIT uuid="+m.Spec.UUID+" mode=install")
}

// DialFrom opens (and closes) a TCP connection to addr from the namespace, bounded by timeout.
func DialFrom(ctx context.Context, ns, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	conn, err := DialerIn(ns)(ctx, addr)
	if err != nil {
		return err
	}

	return conn.Close()
}
