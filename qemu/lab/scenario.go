package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"path/filepath"
	"strings"
	"time"

	"github.com/siderolabs/omni/client/api/omni/specs"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// Env is a running lab: the core with Omni (the stand-in) and the controller, two sites with their edges,
// and two machines per site (BIOS with an IPMI BMC, UEFI with a Redfish BMC).
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

	edgeBin string
	preseed string
	tokens  []string
}

// Binaries are the programs the lab runs.
type Binaries struct {
	Controller, Edge, StandIn string
}

// BuildBinaries builds the controller, the edge and the Omni stand-in into dir.
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

// Setup brings the whole lab up: core, stand-in, controller, two sites with edges, four machines (off).
func Setup(ctx context.Context, l *Lab, bins Binaries, images Images) (*Env, error) {
	e := &Env{Lab: l, Timeline: NewTimeline(filepath.Join(l.Dir, "timeline.md")), edgeBin: bins.Edge}

	var err error

	if e.Core, err = l.AddCore(); err != nil {
		return nil, err
	}

	if e.Omni, err = l.StartStandIn(ctx, e.Core, bins.StandIn); err != nil {
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

	if e.Controller, err = l.StartController(ctx, e.Core, bins.Controller, e.Omni, ControllerOptions{
		LocalAssetsDir: local, PowerCooldown: 5 * time.Second,
	}); err != nil {
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

		edge, err := site.StartEdge(ctx, bins.Edge, EdgeOptions{Token: token, PreseedDir: e.preseed})
		if err != nil {
			return nil, err
		}

		e.Sites, e.Edges, e.tokens = append(e.Sites, site), append(e.Edges, edge), append(e.tokens, token)

		for j, kind := range []struct {
			fw  Firmware
			bmc BMCKind
		}{{BIOS, IPMI}, {UEFI, Redfish}} {
			m, err := site.AddMachine(ctx, MachineSpec{
				Name: fmt.Sprintf("%s-%s", site.Name, kind.fw), UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000%d00%d%d", 0, i, j+1),
				MAC: fmt.Sprintf("52:54:00:0e:%02d:%02d", i, j+1), Firmware: kind.fw, BMC: kind.bmc,
			})
			if err != nil {
				return nil, err
			}

			m.OnInstalled = e.reportInstalled
			e.Machines = append(e.Machines, m)
		}
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

// reportInstalled plays Talos reporting its installation to Omni (the stand-in counts an install event).
func (e *Env) reportInstalled(m *Machine) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := e.Omni.Admin.ReportInstalled(ctx, m.Spec.UUID); err != nil {
		e.Lab.log.Error("report install to omni", errField(err))
	}
}

// Step is one step of the lifecycle scenario.
type Step struct {
	Name string
	Run  func(ctx context.Context) error
}

// Steps returns the lifecycle scenario: a bare dnsmasq boot of the same kinds of machine for comparison,
// discovery and acceptance two machines at a time, allocation of one machine per site, a WAN cut of site 1,
// a crash and restart of site 2's edge, and release while one BMC does not answer for a while.
func (e *Env) Steps() []Step {
	bySite := func(i, j int) *Machine { return e.Machines[i*2+j] }
	bios1, uefi1, bios2, uefi2 := bySite(0, 0), bySite(0, 1), bySite(1, 0), bySite(1, 1)

	return []Step{
		{"for comparison: the same kinds of machine booted by bare dnsmasq + static files", e.bareBoot},
		{"discover and accept the BIOS machines", func(ctx context.Context) error { return e.discoverAndAccept(ctx, bios1, bios2) }},
		{"discover and accept the UEFI machines", func(ctx context.Context) error { return e.discoverAndAccept(ctx, uefi1, uefi2) }},
		{"allocate one machine per site", func(ctx context.Context) error { return e.allocate(ctx, bios1, uefi2) }},
		{"cut site 1's WAN: disk boot and agent mode still work", func(ctx context.Context) error { return e.wanCut(ctx, e.Sites[0], bios1, uefi1) }},
		{"kill site 2's edge and restart it", func(ctx context.Context) error { return e.restartEdge(ctx, 1) }},
		{"release the allocated machines (site 1's BMC stops answering for a while)", func(ctx context.Context) error {
			return e.release(ctx, bios1, bios1, uefi2)
		}},
	}
}

// Run runs the steps in order, stopping at the first failure (returned with the step's name).
func (e *Env) Run(ctx context.Context, onStep func(name string, err error)) error {
	for _, s := range e.Steps() {
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

	return e.timed("accept to ready (bmc provisioned, disk wiped, powered off)", ms, func(m *Machine) error {
		if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
			return err
		}

		return e.waitReadyAndOff(ctx, m)
	})
}

// waitReadyAndOff waits until the machine's disk is wiped (checked on the host), its BMC has a user the agent
// created, Omni reports it ready, and it is powered off.
func (e *Env) waitReadyAndOff(ctx context.Context, m *Machine) error {
	if err := poll(ctx, 5*time.Minute, "bmc user provisioned through the agent", m, func() (bool, error) {
		return len(m.BMCUsersSet()) > 0, nil
	}); err != nil {
		return err
	}

	if err := poll(ctx, 5*time.Minute, "disk wiped (first and last MiB zero on the host)", m, m.DiskWiped); err != nil {
		return err
	}

	if err := poll(ctx, 5*time.Minute, "ready to use in Omni", m, func() (bool, error) {
		_, st, err := e.infraMachine(ctx, m.Spec.UUID)

		return st != nil && st.ReadyToUse, err
	}); err != nil {
		return err
	}

	return poll(ctx, 5*time.Minute, "powered off", m, func() (bool, error) { return !m.Running(), nil })
}

func (e *Env) allocate(ctx context.Context, ms ...*Machine) error {
	return e.timed("allocate to installed OS booted from disk", ms, func(m *Machine) error {
		from := m.Serial.Size()

		if err := e.Omni.Admin.Allocate(ctx, m.Spec.UUID, "lab-"+m.Site.Name, LabTalosVersion, nil, false); err != nil {
			return err
		}

		if err := m.WaitSerial(ctx, from, "OUTPOST-INSTALL-REPORTED", 5*time.Minute); err != nil {
			return err
		}

		return e.waitDiskBoot(ctx, m, from)
	})
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

func (e *Env) wanCut(ctx context.Context, site *Site, installed, idle *Machine) error {
	if err := site.SetWAN(false); err != nil {
		return err
	}

	cutAt := time.Now()

	if err := e.timed("WAN down: installed machine power cycle to disk boot", []*Machine{installed}, func(m *Machine) error {
		from := m.Serial.Size()
		if err := m.Chassis.Reset(ctx); err != nil {
			return err
		}

		return e.waitDiskBoot(ctx, m, from)
	}); err != nil {
		site.SetWAN(true) //nolint:errcheck,gosec

		return err
	}

	idleFrom := idle.Serial.Size()

	if err := e.timed("WAN down: idle machine power-on (one-time PXE) to agent mode", []*Machine{idle}, func(m *Machine) error {
		from := idleFrom
		m.Chassis.SetOverride(pxeOnce)

		if err := m.PowerOn(ctx); err != nil {
			return err
		}

		return m.WaitSerial(ctx, from, AgentStartMarker, 5*time.Minute)
	}); err != nil {
		site.SetWAN(true) //nolint:errcheck,gosec

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

	if err := site.SetWAN(true); err != nil {
		return err
	}

	// Nothing lost: the idle machine joins Omni once the link is back and is powered off again as an accepted,
	// ready machine; the installed machine stays installed.
	err := e.timed("WAN back: idle machine joins and is powered off again", []*Machine{idle}, func(m *Machine) error {
		if err := m.WaitSerial(ctx, idleFrom, "OUTPOST-PROVISIONED", 3*time.Minute); err != nil {
			return err
		}

		return e.waitReadyAndOff(ctx, m)
	})
	e.Timeline.Step("WAN back to idle machine settled", site.Name, start, err)

	if err != nil {
		return err
	}

	_, st, err := e.infraMachine(ctx, installed.Spec.UUID)
	if err != nil {
		return err
	}

	if st == nil || !st.Installed {
		return fmt.Errorf("%s lost its installed state after the WAN cut", installed.Spec.Name)
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

// release releases the machines; silentBMC's BMC stops answering before its release and returns only
// after Omni showed its power as unknown and the controller held off for half a minute.
func (e *Env) release(ctx context.Context, silentBMC *Machine, ms ...*Machine) error {
	return e.timed("release to agent mode, wiped, powered off", ms, func(m *Machine) error {
		from := m.Serial.Size()

		if m == silentBMC {
			if err := m.SetBMCAnswering(false); err != nil {
				return err
			}

			defer m.SetBMCAnswering(true) //nolint:errcheck // restored below; this covers a failure
		}

		if err := e.Omni.Admin.Release(ctx, m.Spec.UUID); err != nil {
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

		return e.waitReadyAndOff(ctx, m)
	})
}

// bmcOutage runs while m's BMC does not answer: Omni must show the machine's power as unknown, the
// controller must say why in its log, and nothing may happen to the machine; then the BMC answers again.
func (e *Env) bmcOutage(ctx context.Context, m *Machine, serialFrom int64) error {
	start := time.Now()
	logFrom := e.Controller.Proc.Log.Size()
	boots := len(m.Boots())

	err := poll(ctx, 2*time.Minute, "power state unknown in Omni while the BMC is silent", m, func() (bool, error) {
		_, st, err := e.infraMachine(ctx, m.Spec.UUID)

		return st != nil && st.PowerState == specs.InfraMachineStatusSpec_POWER_STATE_UNKNOWN, err
	})
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
