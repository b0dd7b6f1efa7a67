package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/omni/client/api/omni/specs"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/qemu/realomni"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Env is a running lab: the core with Omni (a real one or the stand-in) and the controller, two sites with
// their edges, and two machines per site (BIOS with an IPMI BMC, UEFI with a Redfish BMC).
type Env struct {
	Lab        *Lab
	Core       *Core
	Omni       *Omni
	Controller *Controller
	Sites      []*Site
	Edges      []*Proc
	Machines   []*Machine
	// Bare are the same two kinds of machine on a site without an edge (dnsmasq + static files), booted
	// once for comparison.
	Bare     []*Machine
	Timeline *Timeline

	opts     Options
	edgeBin  string
	preseed  string
	tokens   []string
	ctrlBin  string
	ctrlOpts ControllerOptions
	// zeroes are the sites set to wipe with zeroes (controller site set --wipe-method zeroes): their
	// machines' disks are checked byte by byte after a wipe.
	zeroes map[*Site]bool
}

// Binaries are the programs the lab runs.
type Binaries struct {
	Controller, Edge, StandIn string
	// RealOmni is a real Omni and omnictl (BuildRealOmni), needed only against a real Omni.
	RealOmni realomni.Binaries
}

// BuildBinaries builds the controller, the edge and the Omni stand-in into dir (a real Omni comes from
// BuildRealOmni).
func BuildBinaries(ctx context.Context, root, dir string) (Binaries, error) {
	b := Binaries{
		Controller: filepath.Join(dir, "controller"),
		Edge:       filepath.Join(dir, "edge"),
		StandIn:    filepath.Join(dir, "omnistandin"),
	}

	for pkg, out := range map[string]string{"./controller": b.Controller, "./edge": b.Edge, "./qemu/omni/cmd/omnistandin": b.StandIn} {
		if err := GoBuild(ctx, root, pkg, out); err != nil {
			return Binaries{}, err
		}
	}

	return b, nil
}

// Options say which Omni a lab runs against and which steps it takes.
type Options struct {
	// Omni is the lab's Omni (default RealOmni).
	Omni OmniMode
	// StandInOnly (with the stand-in) takes only the steps a real Omni cannot take with machines that are not
	// Talos (power-off once information is collected, install events, installed machines booting their
	// disk); the others are left to a real-Omni run and the timeline says so.
	StandInOnly bool
	// RealAgent runs the real talos-metal-agent on site 2's machines (BIOS with IPMI, UEFI with Redfish), site
	// 1's keep the test agent; the images must be BuildAgentImages'.
	RealAgent bool
}

// labCooldown is the controller's power cooldown in the lab (five minutes in production).
const labCooldown = 5 * time.Second

// Setup brings the whole lab up: core, Omni (real or stand-in), controller, two sites with edges, four
// machines (off).
func Setup(ctx context.Context, l *Lab, bins Binaries, images Images, opts Options) (*Env, error) {
	if opts.Omni == "" {
		opts.Omni = RealOmni
	}

	if opts.StandInOnly && opts.Omni != StandInOmni {
		return nil, fmt.Errorf("lab options: StandInOnly needs the stand-in, not %s", opts.Omni)
	}

	e := &Env{Lab: l, Timeline: NewTimeline(filepath.Join(l.Dir, "timeline.md")), edgeBin: bins.Edge, opts: opts, zeroes: map[*Site]bool{}}

	var err error

	if e.Core, err = l.AddCore(); err != nil {
		return nil, err
	}

	switch opts.Omni {
	case RealOmni:
		start := time.Now()
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

	e.ctrlBin, e.ctrlOpts = bins.Controller, ControllerOptions{LocalAssetsDir: local, PowerCooldown: labCooldown}
	if e.Controller, err = l.StartController(ctx, e.Core, e.ctrlBin, e.Omni, e.ctrlOpts); err != nil {
		return nil, err
	}

	for i := 1; i <= 2; i++ {
		site, err := l.AddSite(e.Core, i)
		if err != nil {
			return nil, err
		}

		token, err := e.Controller.CreateSite(ctx, site.Name)
		if err != nil {
			return nil, err
		}

		if i == 2 {
			// Site 2 wipes with zeroes, its own setting; site 1 keeps the controller's fast wipe.
			if err := e.Controller.SetSite(ctx, site.Name, "--wipe-method", "zeroes"); err != nil {
				return nil, err
			}

			e.zeroes[site] = true
		}

		edge, err := site.StartEdge(ctx, bins.Edge, EdgeOptions{Token: token, PreseedDir: e.preseed})
		if err != nil {
			return nil, err
		}

		e.Sites, e.Edges, e.tokens = append(e.Sites, site), append(e.Edges, edge), append(e.tokens, token)

		for j, kind := range []struct {
			fw  Firmware
			bmc BMCKind
		}{{BIOS, IPMI}, {UEFI, Redfish}} {
			agent := TestAgent
			if opts.RealAgent && i == 2 {
				agent = RealAgent
			}

			m, err := site.AddMachine(ctx, MachineSpec{
				Name: fmt.Sprintf("%s-%s", site.Name, kind.fw), UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000%d00%d%d", 0, i, j+1),
				MAC: fmt.Sprintf("52:54:00:0e:%02d:%02d", i, j+1), Firmware: kind.fw, BMC: kind.bmc, Agent: agent,
			})
			if err != nil {
				return nil, err
			}

			m.OnInstalled = e.reportInstalled
			e.Machines = append(e.Machines, m)
		}
	}

	if opts.StandInOnly {
		return e, nil // the bare comparison is the real-Omni run's
	}

	bare, err := l.AddBareSite(ctx, 3, images)
	if err != nil {
		return nil, err
	}

	for j, fw := range []Firmware{BIOS, UEFI} {
		m, err := bare.AddMachine(ctx, MachineSpec{
			Name: fmt.Sprintf("%s-%s", bare.Name, fw), UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000003%02d", j+1),
			MAC: fmt.Sprintf("52:54:00:0e:03:%02d", j+1), Firmware: fw, BMC: IPMI,
		})
		if err != nil {
			return nil, err
		}

		e.Bare = append(e.Bare, m)
	}

	return e, nil
}

// real reports whether the lab runs against a real Omni.
func (e *Env) real() bool { return e.Omni.Mode == RealOmni }

// whyNoInstallEvent is why a real Omni hears nothing of a lab machine's install.
const whyNoInstallEvent = "a real Omni counts an install only from the event sink a real Talos reaches over SideroLink"

// whyKeptOn is why a real Omni keeps a lab machine powered on.
const whyKeptOn = "a real Omni keeps it on until it has collected its information from a real Talos over SideroLink"

// reportInstalled plays Talos reporting its installation to Omni: the stand-in counts an install event. A
// real Omni counts installs only from a real Talos's event sink, so there it is only logged.
func (e *Env) reportInstalled(m *Machine) {
	if e.real() {
		e.Lab.log.Info("install reported over the bmc channel, not counted by omni: "+whyNoInstallEvent,
			zap.String("machine", m.Spec.Name))

		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := e.Omni.Admin.ReportInstalled(ctx, m.Spec.UUID); err != nil {
		e.Lab.log.Error("report install to omni", errField(err))
	}
}

// Step is one step of the lifecycle scenario. A step with Skip set is not taken in this run: the timeline
// records it with the reason (what cannot happen with this Omni, or which run covers it).
type Step struct {
	Name string
	Run  func(ctx context.Context) error
	Skip string
}

// Steps returns the lifecycle scenario for the lab's Omni: a bare dnsmasq boot of the same kinds of machine
// for comparison, discovery and acceptance two machines at a time, allocation of one machine per site, a WAN
// cut of site 1, a crash and restart of site 2's edge, and release while one BMC does not answer for a
// while. Against a real Omni the steps that need a real Talos (information collection, hence power-off
// after the cooldown; install events) are replaced by what the real Omni does instead, each named with
// why; with StandInOnly only those steps run, against the stand-in.
func (e *Env) Steps() []Step {
	bySite := func(i, j int) *Machine { return e.Machines[i*2+j] }
	bios1, uefi1, bios2, uefi2 := bySite(0, 0), bySite(0, 1), bySite(1, 0), bySite(1, 1)

	switch {
	case e.opts.StandInOnly:
		covered := "covered by the real-Omni run"

		return []Step{
			{Name: "for comparison: bare dnsmasq boot, WAN cut, edge restart, release with a silent BMC", Skip: covered},
			{Name: "discover and accept one machine per site: ready, then powered off after the cooldown (the stand-in counts " +
				"information collected, as a real Omni does once a real Talos reports in)", Run: func(ctx context.Context) error {
				return e.discoverAndAccept(ctx, bios1, uefi2)
			}},
			{Name: "allocate them: install event counted by Omni (the stand-in is told what a real Talos's event sink " +
				"reports), installed OS booted from disk", Run: func(ctx context.Context) error { return e.allocate(ctx, bios1, uefi2) }},
			e.statusPagesStep([]*Machine{bios1, uefi2}, nil),
			{Name: "kill the controller, delete its state directory and start it again; the installed BIOS machine, set " +
				"to network-boot first and reset right then, is told by its edge to boot its disk", Run: func(ctx context.Context) error {
				// BIOS: SeaBIOS goes on to the disk at once when iPXE gives up; OVMF under TCG takes about four
				// minutes to tear its network stack down first (5m16s measured), which the same check passed.
				return e.restartControllerFresh(ctx, bios1)
			}},
			{Name: "release them: agent mode, wiped, powered off", Run: func(ctx context.Context) error {
				return e.release(ctx, nil, bios1, uefi2)
			}},
			e.bmcProtocolsStep(bios1, uefi2),
		}
	case e.real():
		return []Step{
			{Name: "for comparison: the same kinds of machine booted by bare dnsmasq + static files", Run: e.bareBoot},
			{Name: "discover and accept the BIOS machines: ready, kept on (" + whyKeptOn + ")", Run: func(ctx context.Context) error {
				return e.discoverAndAccept(ctx, bios1, bios2)
			}},
			{Name: "discover and accept the UEFI machines: ready, kept on", Run: func(ctx context.Context) error {
				return e.discoverAndAccept(ctx, uefi1, uefi2)
			}},
			{Name: "allocate one machine per site (cluster template, Talos " + LabTalosVersion + "): the install plan PXE-booted, " +
				"talos.config to its edge", Run: func(ctx context.Context) error { return e.allocate(ctx, bios1, uefi2) }},
			e.statusPagesStep([]*Machine{bios1, uefi2}, []*Machine{uefi1, bios2}),
			{Name: "install event counted, installed OS booted from disk as installed", Skip: "the lab's installed OS is not Talos: " + whyNoInstallEvent},
			{Name: "cut site 1's WAN: the allocated machine boots what its install boot wrote to disk (Omni does not count it " +
				"installed), the idle one (kept on) is reset into agent mode", Run: func(ctx context.Context) error {
				return e.wanCut(ctx, e.Sites[0], bios1, uefi1)
			}},
			{Name: "kill site 2's edge and restart it", Run: func(ctx context.Context) error { return e.restartEdge(ctx, 1) }},
			{Name: "kill the controller, delete its state directory and start it again: sites, CA and machine knowledge " +
				"come back from Omni, both edges reconnect with the certificates they had", Run: func(ctx context.Context) error {
				return e.restartControllerFresh(ctx, nil)
			}},
			{Name: "release the allocated machines (cluster delete): new wipe ID, wiped again, ready, kept on (site 1's BMC " +
				"stops answering for a while)", Run: func(ctx context.Context) error { return e.release(ctx, bios1, bios1, uefi2) }},
			e.bmcProtocolsStep(bios1, uefi2),
		}
	default:
		return []Step{
			{Name: "for comparison: the same kinds of machine booted by bare dnsmasq + static files", Run: e.bareBoot},
			{Name: "discover and accept the BIOS machines", Run: func(ctx context.Context) error { return e.discoverAndAccept(ctx, bios1, bios2) }},
			{Name: "discover and accept the UEFI machines", Run: func(ctx context.Context) error { return e.discoverAndAccept(ctx, uefi1, uefi2) }},
			{Name: "allocate one machine per site", Run: func(ctx context.Context) error { return e.allocate(ctx, bios1, uefi2) }},
			e.statusPagesStep([]*Machine{bios1, uefi2}, []*Machine{uefi1, bios2}),
			{Name: "cut site 1's WAN: disk boot and agent mode still work", Run: func(ctx context.Context) error {
				return e.wanCut(ctx, e.Sites[0], bios1, uefi1)
			}},
			{Name: "kill site 2's edge and restart it", Run: func(ctx context.Context) error { return e.restartEdge(ctx, 1) }},
			{Name: "kill the controller, delete its state directory and start it again: sites, CA and machine knowledge " +
				"come back from Omni, both edges reconnect with the certificates they had; an installed machine reset " +
				"right then network-boots to its disk", Run: func(ctx context.Context) error {
				// The BIOS machine, as in the real-Omni run's stand-in half: OVMF under TCG takes four to five
				// minutes to tear its network stack down after iPXE gives up, as long as the check waits.
				return e.restartControllerFresh(ctx, bios1)
			}},
			{Name: "release the allocated machines (site 1's BMC stops answering for a while)", Run: func(ctx context.Context) error {
				return e.release(ctx, bios1, bios1, uefi2)
			}},
			e.bmcProtocolsStep(bios1, uefi2),
		}
	}
}

// bmcProtocolsStep checks, once the machines went through their lifecycle, which protocol carried it (the
// controller's --bmc-protocol auto: Redfish where the BMC answers it): the driven machines (allocated and
// released: power off, one-time PXE, power on) with a Redfish BMC were driven over Redfish, those with an
// IPMI-only BMC over IPMI; and no machine with a Redfish BMC got a single IPMI power or boot call.
func (e *Env) bmcProtocolsStep(driven ...*Machine) Step {
	var names []string
	for _, m := range driven {
		names = append(names, m.Spec.Name)
	}

	return Step{
		Name: "BMC protocols: " + strings.Join(names, ", ") + " driven over their BMC's protocol (UEFI machines' power and " +
			"one-time PXE over Redfish, BIOS machines' over IPMI); no machine with a Redfish BMC got an IPMI call",
		Run: func(context.Context) error {
			var errs []error

			for _, m := range e.Machines {
				ipmi, redfish := m.BMCActions()
				e.Lab.log.Info("bmc actions", zap.String("machine", m.Spec.Name), zap.String("bmc", string(m.Spec.BMC)),
					zap.Int64("ipmi", ipmi), zap.Int64("redfish", redfish))

				isDriven := slices.Contains(driven, m)

				switch {
				case m.Spec.BMC == Redfish && ipmi != 0:
					errs = append(errs, fmt.Errorf("%s (Redfish BMC): %d IPMI actions, want none", m.Spec.Name, ipmi))
				case m.Spec.BMC == Redfish && isDriven && redfish == 0:
					errs = append(errs, fmt.Errorf("%s (Redfish BMC): driven, but no Redfish action", m.Spec.Name))
				case m.Spec.BMC == IPMI && isDriven && ipmi == 0:
					errs = append(errs, fmt.Errorf("%s (IPMI BMC): driven, but no IPMI action", m.Spec.Name))
				}
			}

			return errors.Join(errs...)
		},
	}
}

// statusPagesStep checks the controller's status pages in a headless browser (checkStatusPages) after the
// allocation: the allocated machines installed (installing against a real Omni, which never hears of a lab
// machine's install), the idle ones ready. Without Chromium the step is skipped with the reason.
func (e *Env) statusPagesStep(allocated, idle []*Machine) Step {
	installed := "installed"
	if e.real() {
		installed = "installing"
	}

	want := map[*Machine]string{}

	var names []string

	for _, m := range allocated {
		want[m] = installed
		names = append(names, m.Spec.Name+" "+installed)
	}

	for _, m := range idle {
		want[m] = "ready"
		names = append(names, m.Spec.Name+" ready")
	}

	return Step{
		Name: "status pages in headless Chromium: sites connected with machines counted by phase; " + strings.Join(names, ", ") +
			" at their site, as the controller's CLI reports; each timeline's boot steps in order",
		Run:  func(ctx context.Context) error { return e.checkStatusPages(ctx, want) },
		Skip: browserSkip(),
	}
}

// Run runs the steps in order, stopping at the first failure (returned with the step's name).
func (e *Env) Run(ctx context.Context, onStep func(name string, err error)) error {
	for _, s := range e.Steps() {
		if s.Skip != "" {
			e.Timeline.Skip(s.Name, s.Skip)

			continue
		}

		start := time.Now()
		err := s.Run(ctx)

		e.Timeline.Step(s.Name, "", start, err)

		if onStep != nil {
			onStep(s.Name, err)
		}

		if err != nil {
			return fmt.Errorf("step %q: %w\nlast controller errors:\n%s", s.Name, err, e.controllerErrors(5))
		}
	}

	return e.Timeline.Write()
}

// timed runs fn for each machine in parallel and records its duration on the timeline.
func (e *Env) timed(step string, ms []*Machine, fn func(m *Machine) error) error {
	errs := make(chan error, len(ms))

	for _, m := range ms {
		go func() {
			start := time.Now()
			err := fn(m)
			e.Timeline.Step(step, m.Spec.Name, start, err)

			if err != nil {
				err = fmt.Errorf("%s: %w", m.Spec.Name, err)
			}

			errs <- err
		}()
	}

	var all []error
	for range ms {
		all = append(all, <-errs)
	}

	return errors.Join(all...)
}

// poll calls cond until it returns true, an error, or the timeout passes; what says what was awaited.
func poll(ctx context.Context, timeout time.Duration, what string, m *Machine, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)

	for {
		ok, err := cond()
		if err != nil {
			return err
		}

		if ok {
			return nil
		}

		if m != nil {
			if err := m.Failures(); err != nil {
				return err
			}
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// infraMachine returns Omni's view of a machine (nil when it does not exist).
func (e *Env) infraMachine(ctx context.Context, id string) (*specs.InfraMachineSpec, *specs.InfraMachineStatusSpec, error) {
	rows, err := e.Omni.Admin.List(ctx)
	if err != nil {
		return nil, nil, err
	}

	for _, r := range rows {
		if r.ID == id {
			return r.Spec, r.Status, nil
		}
	}

	return nil, nil, nil
}

func (e *Env) discoverAndAccept(ctx context.Context, ms ...*Machine) error {
	if err := e.timed("power-on to agent tunnel up and pending in Omni", ms, func(m *Machine) error {
		from := m.Serial.Size()
		start := time.Now()

		if err := m.PowerOn(ctx); err != nil {
			return err
		}

		// The same measure as the bare comparison's.
		err := m.WaitSerial(ctx, from, AgentStartMarker, 5*time.Minute)
		e.Timeline.Step(agentStartStep+" (edge)", m.Spec.Name, start, err)

		if err != nil {
			return err
		}

		if err := m.WaitSerial(ctx, from, "OUTPOST-PROVISIONED", 5*time.Minute); err != nil {
			return err
		}

		return poll(ctx, time.Minute, "pending InfraMachine", m, func() (bool, error) {
			spec, _, err := e.infraMachine(ctx, m.Spec.UUID)

			return spec != nil && spec.AcceptanceStatus == specs.InfraMachineConfigSpec_PENDING, err
		})
	}); err != nil {
		return err
	}

	step := "accept to ready (bmc provisioned, disk wiped), powered off after the cooldown"
	if e.real() {
		step = "accept to ready (bmc provisioned, disk wiped), kept on past the cooldown"
	}

	return e.timed(step, ms, func(m *Machine) error {
		if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
			return err
		}

		return e.waitSettled(ctx, m)
	})
}

// waitSettled waits until an idle machine is ready and settled: powered off with the stand-in, kept on (and
// preferred on by Omni) with a real Omni.
func (e *Env) waitSettled(ctx context.Context, m *Machine) error {
	if err := e.waitReady(ctx, m); err != nil {
		return err
	}

	if e.real() {
		return e.keptOn(ctx, m)
	}

	return poll(ctx, 5*time.Minute, "powered off", m, func() (bool, error) { return !m.Running(), nil })
}

// waitReady waits until the machine's disk is wiped (checked on the host), its BMC has a user the agent
// created, and Omni reports it ready.
func (e *Env) waitReady(ctx context.Context, m *Machine) error {
	if err := poll(ctx, 5*time.Minute, "bmc user provisioned through the agent", m, func() (bool, error) {
		return m.AgentCreatedBMCUser(), nil
	}); err != nil {
		return err
	}

	wiped, what := m.DiskWiped, "disk wiped (first and last MiB zero on the host)"
	if e.zeroes[m.Site] {
		wiped, what = m.DiskZeroed, "disk zeroed, every byte read on the host (the site's --wipe-method zeroes)"
	}

	if err := poll(ctx, 5*time.Minute, what, m, wiped); err != nil {
		return err
	}

	return poll(ctx, 5*time.Minute, "ready to use in Omni", m, func() (bool, error) {
		_, st, err := e.infraMachine(ctx, m.Spec.UUID)

		return st != nil && st.ReadyToUse, err
	})
}

// keptOn checks what a real Omni does with a ready machine that is not Talos: it prefers it on (it has not
// collected its information) and the controller keeps it on past twice the cooldown.
func (e *Env) keptOn(ctx context.Context, m *Machine) error {
	if err := poll(ctx, time.Minute, "Omni preferring the machine on", m, func() (bool, error) {
		spec, _, err := e.infraMachine(ctx, m.Spec.UUID)

		return spec != nil && spec.PreferredPowerState == specs.InfraMachineSpec_POWER_STATE_ON, err
	}); err != nil {
		return err
	}

	return hold(ctx, 2*labCooldown, "powered on ("+whyKeptOn+")", m, func() (bool, error) { return m.Running(), nil })
}

// hold checks cond for d, failing as soon as it does not hold (what must stay true, not what is awaited).
func hold(ctx context.Context, d time.Duration, what string, m *Machine, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)

	for {
		ok, err := cond()
		if err != nil {
			return err
		}

		if !ok {
			return fmt.Errorf("%s: did not hold for %s", what, d)
		}

		if err := m.Failures(); err != nil {
			return err
		}

		if time.Now().After(deadline) {
			return nil
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitPowerOn waits until Omni shows the machine powered on, as the controller read it from its BMC.
func (e *Env) waitPowerOn(ctx context.Context, m *Machine) error {
	return poll(ctx, 2*time.Minute, "power state on in Omni", m, func() (bool, error) {
		_, st, err := e.infraMachine(ctx, m.Spec.UUID)

		return st != nil && st.PowerState == specs.InfraMachineStatusSpec_POWER_STATE_ON, err
	})
}

// clusterOf is the cluster the lab allocates a machine to: one per site.
func clusterOf(m *Machine) string { return "lab-" + m.Site.Name }

// allocate allocates the machines (Omni: a cluster per site, Talos LabTalosVersion) and waits for the
// install plan's boot, whose kernel command line must carry talos.config pointing at the machine's edge;
// with the stand-in the install event is counted and the installed OS boots from disk, with a real Omni
// (which hears of no install: whyNoInstallEvent) the lab's install is only seen written.
func (e *Env) allocate(ctx context.Context, ms ...*Machine) error {
	step := "allocate to installed OS booted from disk"
	if e.real() {
		step = "allocate (cluster template sync) to the install plan PXE-booted with talos.config to its edge"
	}

	return e.timed(step, ms, func(m *Machine) error {
		from := m.Serial.Size()

		if err := e.Omni.Allocate(ctx, m.Spec.UUID, clusterOf(m)); err != nil {
			return err
		}

		if err := poll(ctx, 2*time.Minute, "allocated in Omni with Talos "+LabTalosVersion, m, func() (bool, error) {
			spec, _, err := e.infraMachine(ctx, m.Spec.UUID)

			return spec != nil && spec.ClusterTalosVersion == LabTalosVersion, err
		}); err != nil {
			return err
		}

		if err := e.waitInstallBoot(ctx, m, from); err != nil {
			return err
		}

		if e.real() {
			return m.WaitSerial(ctx, from, "OUTPOST-INSTALL-WRITTEN", 3*time.Minute)
		}

		if err := m.WaitSerial(ctx, from, "OUTPOST-INSTALL-REPORTED", 5*time.Minute); err != nil {
			return err
		}

		if err := poll(ctx, time.Minute, "installed in Omni", m, func() (bool, error) {
			_, st, err := e.infraMachine(ctx, m.Spec.UUID)

			return st != nil && st.Installed, err
		}); err != nil {
			return err
		}

		return e.waitDiskBoot(ctx, m, from)
	})
}

// waitInstallBoot waits for the install plan's boot after from and checks its kernel command line (the lab's
// /init prints it) for talos.config at the machine's edge, with iPXE's ${uuid} filled in: what lets an
// installed Talos fetch its join config and reach Omni.
func (e *Env) waitInstallBoot(ctx context.Context, m *Machine, from int64) error {
	marker := "OUTPOST-INIT uuid=" + m.Spec.UUID + " mode=install cmdline="
	if err := m.WaitSerial(ctx, from, marker, 5*time.Minute); err != nil {
		return err
	}

	cmdline := lineAfter(m.Serial.Since(from), marker)
	want := "talos.config=http://" + m.Site.EdgeIP() + "/config?u=" + m.Spec.UUID

	if !slices.Contains(strings.Fields(cmdline), want) {
		return fmt.Errorf("the install boot's kernel command line lacks %s: %s", want, cmdline)
	}

	e.Lab.log.Info("install boot", zap.String("machine", m.Spec.Name), zap.String("cmdline", cmdline))

	return nil
}

// lineAfter returns the rest of the first line of b that holds marker, after the marker.
func lineAfter(b []byte, marker string) string {
	_, rest, ok := bytes.Cut(b, []byte(marker))
	if !ok {
		return ""
	}

	line, _, _ := bytes.Cut(rest, []byte("\n"))

	return strings.TrimSpace(string(line))
}

// waitDiskBoot waits for the installed OS's marker after from, and checks that boot did not use the network.
func (e *Env) waitDiskBoot(ctx context.Context, m *Machine, from int64) error {
	marker := "OUTPOST-INSTALLED-OS " + m.Spec.UUID + " " + string(m.Spec.Firmware)
	if err := m.WaitSerial(ctx, from, marker, 3*time.Minute); err != nil {
		return err
	}

	last := m.LastBoot()
	if last.PXE {
		return fmt.Errorf("the disk boot had the one-time PXE flag set")
	}

	out := m.Serial.Since(last.SerialOffset)
	for _, netboot := range []string{"iPXE", "PXE over IPv4", "Start PXE"} {
		if bytes.Contains(out, []byte(netboot)) {
			return fmt.Errorf("the disk boot touched the network (%q on the console)", netboot)
		}
	}

	return nil
}

// wanCut cuts the site's WAN for a minute: the allocated machine is power cycled and boots its disk, the idle
// one network-boots agent mode from the edge's cached table; once the link is back the idle machine joins
// Omni again and settles, and nothing was lost. With the stand-in the idle machine is off (powered on with
// one-time PXE) and the allocated one is installed in Omni's view; with a real Omni the idle machine is on
// (reset with one-time PXE) and the allocated one's disk holds what its install boot wrote, which Omni does
// not count as installed (whyNoInstallEvent).
func (e *Env) wanCut(ctx context.Context, site *Site, allocated, idle *Machine) error {
	if err := site.SetWAN(false); err != nil {
		return err
	}

	cutAt := time.Now()

	diskStep := "WAN down: installed machine power cycle to disk boot"
	if e.real() {
		diskStep = "WAN down: allocated machine power cycle to disk boot (the lab's install wrote it; Omni does not count it installed)"
	}

	if err := e.timed(diskStep, []*Machine{allocated}, func(m *Machine) error {
		from := m.Serial.Size()
		if err := m.Chassis.Reset(ctx); err != nil {
			return err
		}

		return e.waitDiskBoot(ctx, m, from)
	}); err != nil {
		site.SetWAN(true) //nolint:errcheck

		return err
	}

	idleFrom := idle.Serial.Size()

	idleStep := "WAN down: idle machine power-on (one-time PXE) to agent mode"
	if e.real() {
		idleStep = "WAN down: idle machine (kept on) reset with one-time PXE to agent mode"
	}

	if err := e.timed(idleStep, []*Machine{idle}, func(m *Machine) error {
		m.Chassis.SetOverride(pxeOnce)

		// Kept on by a real Omni, off with the stand-in: Reset powers on a machine that is off.
		if err := m.Chassis.Reset(ctx); err != nil {
			return err
		}

		return m.WaitSerial(ctx, idleFrom, AgentStartMarker, 5*time.Minute)
	}); err != nil {
		site.SetWAN(true) //nolint:errcheck

		return err
	}

	// Keep the link down for a minute in all.
	if wait := time.Minute - time.Since(cutAt); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}

	start := time.Now()
	edge := e.Edges[site.Index-1]
	edgeFrom := edge.Log.Size()

	if err := site.SetWAN(true); err != nil {
		return err
	}

	// The edge redials with its backoff (up to a minute); until then the controller cannot reach the site.
	err := edge.Log.WaitFor(ctx, edgeFrom, `"uplink connected"`, 2*time.Minute)
	e.Timeline.Step("WAN back to uplink reconnected", site.Name, start, err)

	if err != nil {
		return err
	}

	// Nothing lost: the idle machine joins Omni once the link is back and settles again as an accepted,
	// ready machine (powered off with the stand-in, kept on by a real Omni); the allocated machine stays
	// installed (stand-in) or allocated (real Omni).
	backStep := "WAN back: idle machine joins and is powered off again"
	if e.real() {
		backStep = "WAN back: idle machine joins Omni again, ready, kept on"
	}

	err = e.timed(backStep, []*Machine{idle}, func(m *Machine) error {
		if err := m.WaitSerial(ctx, idleFrom, "OUTPOST-PROVISIONED", 3*time.Minute); err != nil {
			return err
		}

		return e.waitSettled(ctx, m)
	})
	e.Timeline.Step("WAN back to idle machine settled", site.Name, start, err)

	if err != nil {
		return err
	}

	// The controller reads the allocated machine's BMC through the edge again.
	if err := e.waitPowerOn(ctx, allocated); err != nil {
		return err
	}

	spec, st, err := e.infraMachine(ctx, allocated.Spec.UUID)
	if err != nil {
		return err
	}

	switch {
	case e.real() && (spec == nil || spec.ClusterTalosVersion != LabTalosVersion):
		return fmt.Errorf("%s lost its allocation after the WAN cut", allocated.Spec.Name)
	case !e.real() && (st == nil || !st.Installed):
		return fmt.Errorf("%s lost its installed state after the WAN cut", allocated.Spec.Name)
	}

	return nil
}

// restartEdge kills a site's edge (a crash), leaves it down a few seconds and starts it again; it must
// reconnect with its enrolled identity. The release step that follows proves the controller recovered.
func (e *Env) restartEdge(ctx context.Context, i int) error {
	start := time.Now()
	from := e.Edges[i].Log.Size()

	e.Edges[i].Kill()

	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
	}

	p, err := e.Sites[i].StartEdge(ctx, e.edgeBin, EdgeOptions{Token: e.tokens[i], PreseedDir: e.preseed, Restart: true})
	if err != nil {
		return err
	}

	e.Edges[i] = p
	err = p.Log.WaitFor(ctx, from, `"uplink connected"`, 2*time.Minute)
	e.Timeline.Step("edge killed to uplink back", e.Sites[i].Name, start, err)

	return err
}

// restartControllerFresh kills the controller, deletes its state directory and starts it again, as a controller
// moved to a new host would start: with Omni, its sites, enrollment CA and machine locations are in Omni, so it
// loads the CA from there (the edges' certificates and pinned fingerprint still hold: a new CA would fail their
// TLS), lists both sites, and knows every machine before it decides anything. The release step that follows
// shows the lifecycle carrying on.
//
// installed is reset the moment the new controller starts: its firmware network-boots first, and its edge
// must still tell it to boot its disk, from the boot table it holds while the controller knows nothing yet
// and after the controller has pushed its own (which never drops a machine it has not heard of).
func (e *Env) restartControllerFresh(ctx context.Context, installed *Machine) error {
	start := time.Now()
	ctrlFrom := e.Controller.Proc.Log.Size()

	edgeFrom := make([]int64, len(e.Edges))
	for i, p := range e.Edges {
		edgeFrom[i] = p.Log.Size()
	}

	e.Controller.Proc.Kill()

	if err := os.RemoveAll(e.Controller.StateDir); err != nil {
		return fmt.Errorf("delete the controller's state directory: %w", err)
	}

	opts := e.ctrlOpts
	opts.Restart = true

	c, err := e.Lab.StartController(ctx, e.Core, e.ctrlBin, e.Omni, opts)
	if err != nil {
		return err
	}

	e.Controller = c

	var diskFrom int64

	resetAt := time.Now()

	var siteEdgeFrom int64

	if installed != nil {
		// Network first, as many installed servers are left: every boot asks the edge.
		diskFrom = installed.Serial.Size()
		siteEdgeFrom = e.Edges[installed.Site.Index-1].Log.Size()
		installed.Chassis.SetOverride(vbmc.Override{Device: vbmc.BootPXE, Mode: bootModeOf(installed), Persistent: true})

		if err := installed.Chassis.Reset(ctx); err != nil {
			return err
		}
	}

	for _, needle := range []string{`"ca":"omni"`, `"machine locations loaded from omni"`} {
		if err := c.Proc.Log.WaitFor(ctx, ctrlFrom, needle, time.Minute); err != nil {
			return fmt.Errorf("restarted controller: %w", err)
		}
	}

	for i, p := range e.Edges {
		if err := p.Log.WaitFor(ctx, edgeFrom[i], `"uplink connected"`, 2*time.Minute); err != nil {
			return fmt.Errorf("%s's edge after the controller restart: %w", e.Sites[i].Name, err)
		}
	}

	list, err := c.site(ctx, "list")
	if err != nil {
		return err
	}

	for _, s := range e.Sites {
		if !strings.Contains(list, s.Name) {
			return fmt.Errorf("site %s missing after the restart:\n%s", s.Name, list)
		}
	}

	e.Timeline.Step("controller killed, state deleted, to both edges back", "", start, nil)

	if installed == nil {
		return nil
	}

	err = e.waitNetbootToDisk(ctx, installed, diskFrom, siteEdgeFrom)
	e.Timeline.Step("installed machine (network first) reset as the controller restarted, to disk boot", installed.Spec.Name, resetAt, err)

	// Back to disk first, as the lab's machines are elsewhere.
	installed.Chassis.SetOverride(vbmc.Override{Mode: bootModeOf(installed)})

	return err
}

// bootModeOf is the chassis boot mode matching m's firmware.
func bootModeOf(m *Machine) metal.Firmware {
	if m.Spec.Firmware == UEFI {
		return metal.UEFI
	}

	return metal.BIOS
}

// waitNetbootToDisk waits until m, booting network first, reached its installed OS: the VM started network
// first, its site's edge answered its MAC's PXE request after the reset (edgeFrom: the edge log's size then),
// and the edge's answer sent it on to its disk instead of agent mode or an install. (SeaBIOS's iPXE prints to
// the screen, not the serial console, so the edge's log is the evidence the network was asked.)
func (e *Env) waitNetbootToDisk(ctx context.Context, m *Machine, from, edgeFrom int64) error {
	marker := "OUTPOST-INSTALLED-OS " + m.Spec.UUID + " " + string(m.Spec.Firmware)
	if err := m.WaitSerial(ctx, from, marker, 5*time.Minute); err != nil {
		return fmt.Errorf("network-first boot did not reach the installed OS: %w", err)
	}

	if !m.LastBoot().PXE {
		return fmt.Errorf("the machine did not start network first")
	}

	if !e.Edges[m.Site.Index-1].Log.Contains(edgeFrom, `"msg":"proxydhcp reply","component":"dhcp","mac":"`+strings.ToLower(m.Spec.MAC)+`"`) {
		return fmt.Errorf("the site's edge answered no PXE request of %s after the reset", m.Spec.MAC)
	}

	out := m.Serial.Since(from)
	for _, wrong := range []string{AgentStartMarker, "OUTPOST-INIT"} {
		if bytes.Contains(out, []byte(wrong)) {
			return fmt.Errorf("the installed machine was network-booted (%s) instead of sent to its disk", wrong)
		}
	}

	return nil
}

// release releases the machines (a real Omni's cluster is deleted, the stand-in's node removed): Omni sets a
// new wipe ID, the controller reboots each into agent mode and wipes it again, and it settles as a ready
// machine. silentBMC's BMC (nil: none) stops answering before its release and returns only after Omni showed
// its power as unknown and the controller held off for half a minute.
func (e *Env) release(ctx context.Context, silentBMC *Machine, ms ...*Machine) error {
	step := "release to agent mode, wiped, powered off"
	if e.real() {
		step = "release (cluster delete) to a new wipe ID, agent mode, wiped again, ready, kept on"
	}

	return e.timed(step, ms, func(m *Machine) error {
		from := m.Serial.Size()

		spec, _, err := e.infraMachine(ctx, m.Spec.UUID)
		if err != nil {
			return err
		}

		if spec == nil {
			return fmt.Errorf("%s is not in Omni", m.Spec.Name)
		}

		wipeID := spec.WipeId

		if m == silentBMC {
			// Known before the BMC goes silent, so that "unknown" is the silence's doing.
			if err := e.waitPowerOn(ctx, m); err != nil {
				return err
			}

			if err := m.SetBMCAnswering(false); err != nil {
				return err
			}

			defer m.SetBMCAnswering(true) //nolint:errcheck // restored below; this covers a failure
		}

		if err := e.Omni.Release(ctx, m.Spec.UUID, clusterOf(m)); err != nil {
			return err
		}

		if err := poll(ctx, 2*time.Minute, "a new wipe ID in Omni, no cluster", m, func() (bool, error) {
			spec, _, err := e.infraMachine(ctx, m.Spec.UUID)

			return spec != nil && spec.WipeId != wipeID && spec.ClusterTalosVersion == "", err
		}); err != nil {
			return err
		}

		if m == silentBMC {
			if err := e.bmcOutage(ctx, m, from); err != nil {
				return err
			}
		}

		if err := m.WaitSerial(ctx, from, AgentStartMarker, 5*time.Minute); err != nil {
			return err
		}

		return e.waitSettled(ctx, m)
	})
}

// bmcOutage runs while m's BMC does not answer: Omni must show the machine's power as unknown, the
// controller must say why in its log, and nothing may happen to the machine; then the BMC answers again.
func (e *Env) bmcOutage(ctx context.Context, m *Machine, serialFrom int64) error {
	start := time.Now()
	logFrom := e.Controller.Proc.Log.Size()
	boots := len(m.Boots())

	last := "no status"

	err := poll(ctx, 2*time.Minute, "power state unknown in Omni while the BMC is silent", m, func() (bool, error) {
		_, st, err := e.infraMachine(ctx, m.Spec.UUID)
		if st != nil {
			last = st.PowerState.String()
		}

		return st != nil && st.PowerState == specs.InfraMachineStatusSpec_POWER_STATE_UNKNOWN, err
	})
	if err != nil {
		err = fmt.Errorf("%w (Omni still shows %s)", err, last)
	}
	e.Timeline.Step("BMC silent to power unknown in Omni", m.Spec.Name, start, err)

	if err != nil {
		return err
	}

	if err := poll(ctx, time.Minute, "the controller logging why it cannot reach the BMC", m, func() (bool, error) {
		return bmcUnreachableLogged(e.Controller.Proc.Log.Since(logFrom), m.Spec.UUID), nil
	}); err != nil {
		return err
	}

	// Hold the outage for half a minute in all: the release cannot be carried out, so nothing may happen.
	if wait := 30*time.Second - time.Since(start); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}

	if n := len(m.Boots()); n != boots || m.Serial.Contains(serialFrom, AgentStartMarker) {
		return fmt.Errorf("the machine was restarted while its BMC did not answer (%d boots, was %d)", n, boots)
	}

	back := time.Now()

	if err := m.SetBMCAnswering(true); err != nil {
		return err
	}

	err = m.WaitSerial(ctx, serialFrom, AgentStartMarker, 5*time.Minute)
	e.Timeline.Step("BMC back to the release's reboot reaching agent mode", m.Spec.Name, back, err)

	return err
}

// bmcUnreachableLogged tells whether a controller log names the machine with an error from its BMC (and
// does not blame the site, whose uplink is up).
func bmcUnreachableLogged(log []byte, uuid string) bool {
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"machine":"`+uuid+`"`) && strings.Contains(line, `"power state unknown"`) &&
			strings.Contains(line, `"error":"`) && strings.Contains(line, "on bmc ") && !strings.Contains(line, "site offline") {
			return true
		}
	}

	return false
}

// agentStartStep is the step both the edge and the bare comparison measure.
const agentStartStep = "power-on to agent start"

// bareBoot boots the bare site's machines to their agent start, the classic dnsmasq + static files set-up,
// to compare with the edge's boots of the same kinds of machine in this run; then turns them off.
func (e *Env) bareBoot(ctx context.Context) error {
	return e.timed(agentStartStep+" (bare dnsmasq + static files)", e.Bare, func(m *Machine) error {
		defer m.PowerOffNow()

		return m.PowerOnToAgent(ctx, 4*time.Minute)
	})
}

// Status is one row of the lab's live table.
type Status struct {
	Site, Machine, Power, Phase, LastEvent string
}

// Statuses returns the live table: each machine's power (its QEMU process), phase (Omni's view) and the last
// OUTPOST-* line of its serial console; the bare comparison machines come last.
func (e *Env) Statuses(ctx context.Context) []Status {
	rows, _ := e.Omni.Admin.List(ctx) //nolint:errcheck // an empty phase column says Omni did not answer

	out := make([]Status, 0, len(e.Machines)+len(e.Bare))

	// The bare comparison machines are not in Omni: their phase stays "-".
	for _, m := range append(append([]*Machine(nil), e.Machines...), e.Bare...) {
		s := Status{Site: m.Site.Name, Machine: m.Spec.Name, Power: "off", Phase: "-", LastEvent: lastMarker(m)}
		if m.Running() {
			s.Power = "on"
		}

		for _, r := range rows {
			if r.ID != m.Spec.UUID {
				continue
			}

			s.Phase = phase(r.Spec, r.Status)
		}

		out = append(out, s)
	}

	return out
}

func phase(spec *specs.InfraMachineSpec, st *specs.InfraMachineStatusSpec) string {
	switch {
	case spec.AcceptanceStatus == specs.InfraMachineConfigSpec_PENDING:
		return "pending"
	case spec.AcceptanceStatus == specs.InfraMachineConfigSpec_REJECTED:
		return "rejected"
	case st != nil && st.Installed:
		return "installed"
	case spec.ClusterTalosVersion != "":
		return "allocated"
	case st != nil && st.ReadyToUse:
		return "ready"
	default:
		return "accepted"
	}
}

func lastMarker(m *Machine) string {
	b := m.Serial.Since(max(m.Serial.Size()-16384, 0))
	lines := strings.Split(string(b), "\n")

	for i := len(lines) - 1; i >= 0; i-- {
		if idx := strings.Index(lines[i], "OUTPOST-"); idx >= 0 {
			return strings.TrimSpace(lines[i][idx:])
		}

		if idx := strings.Index(lines[i], "disk wiped"); idx >= 0 {
			return "disk wiped"
		}
	}

	return ""
}

// pxeOnce is the one-time PXE boot override an operator (or the controller) sets before a power-on.
var pxeOnce = vbmc.Override{Device: vbmc.BootPXE}

func errField(err error) zap.Field { return zap.Error(err) }

// controllerErrors returns the controller's last n error lines (distinct), for a failing step's report.
func (e *Env) controllerErrors(n int) string {
	lines := strings.Split(e.Controller.Proc.Log.Tail(1<<20), "\n")
	seen := map[string]bool{}

	var out []string

	for i := len(lines) - 1; i >= 0 && len(out) < n; i-- {
		l := lines[i]
		if !strings.Contains(l, `"level":"error"`) {
			continue
		}

		msg := l
		if idx := strings.Index(l, `"error":`); idx >= 0 {
			msg = l[idx:]
		}

		if len(msg) > 400 {
			msg = msg[:400]
		}

		if !seen[msg] {
			seen[msg] = true
			out = append(out, "  "+msg)
		}
	}

	return strings.Join(out, "\n")
}
