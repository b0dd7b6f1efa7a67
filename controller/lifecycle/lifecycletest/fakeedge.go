// Package lifecycletest holds a hand-written fake of the sites' edges for lifecycle tests: machines with power,
// a one-time PXE flag, an agent and acknowledged boot plans, modelled as state, with every call logged.
package lifecycletest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Machine is a machine as the fake edge models it.
type Machine struct {
	Site      string
	Power     bool
	Agent     bool
	PXEOnce   bool
	Image     string // the mode of the virtual-media image mounted ("" none); it boots before the disk
	OnDisk    bool   // Talos installed on disk (the machine boots it without PXE)
	Booted    string // mode the machine last booted into
	IPMIUser  string
	IPMIPass  string
	Acked     bootplans.Plan
	AckedSeen bool
	Alert     string // the machine's identity alert, as the locations would hold it
	// SecureBoot is what the machine's BMC said of its Secure Boot, as the locations would hold it
	// (lifecycle.SecureBootReports).
	SecureBoot bootpb.SecureBoot
}

// FakeEdge is every edge-side collaborator of the lifecycle at once.
var (
	_ lifecycle.PowerClient = (*FakeEdge)(nil)
	_ lifecycle.AgentClient = (*FakeEdge)(nil)
	_ lifecycle.SiteLocator = (*FakeEdge)(nil)
	_ lifecycle.PlanPusher  = (*FakeEdge)(nil)

	_ lifecycle.SecureBootReports = (*FakeEdge)(nil)
)

// FakeEdge models the sites' edges: machines with power, PXE-once flag, agent and acknowledged plans.
// It logs every call as "<machine> <Call> [detail]" so tests assert on order and counts.
type FakeEdge struct {
	mu       sync.Mutex
	machines map[string]*Machine
	offline  map[string]bool
	version  uint64
	log      []string
	holdAck  chan struct{}   // when non-nil, Push waits for it before acknowledging
	holdWipe chan struct{}   // when non-nil, WipeDisks waits for it (or its context) before wiping
	dropAt   map[string]bool // sites that go offline right after their next acknowledgement
	// statusReads counts PowerStatus calls per machine (not logged: the observation makes one every poll)
	statusReads map[string]int
	deadBMC     map[string]bool // machines whose BMC does not answer
	// fail holds the error each "<machine> <Call>" fails with (FailCalls); attempts counts every call made,
	// failed ones included, by the same key.
	fail     map[string]error
	attempts map[string]int
	// intents carries out calls with an intent ID at most once; lose counts the replies to lose.
	intents *intentBook
	lose    map[string]int
	// reach is how each site's machines reach its edge, as SetReach set it (lifecycle.SiteReach).
	reach map[string]*bootpb.Reach
}

// NewFakeEdge returns a fake edge with no machines. Its calls that carry an intent ID are carried out at most
// once, as at the edge.
func NewFakeEdge(t testing.TB) *FakeEdge {
	t.Helper()

	return &FakeEdge{machines: map[string]*Machine{}, offline: map[string]bool{}, dropAt: map[string]bool{}, statusReads: map[string]int{}, deadBMC: map[string]bool{},
		fail: map[string]error{}, attempts: map[string]int{}, lose: map[string]int{}, intents: newIntentBook()}
}

// FailCalls makes every call of machine id named call ("WipeDisks", "PowerOn", ...) fail with err before it
// reaches the machine, while everything else, the agent's presence included, looks as before: a call broken
// by an uplink cut the controller has not noticed yet. A nil err lets the calls through again.
func (f *FakeEdge) FailCalls(id, call string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err == nil {
		delete(f.fail, id+" "+call)

		return
	}

	f.fail[id+" "+call] = err
}

// Attempts returns how many times machine id's call named call was made, failed attempts included.
func (f *FakeEdge) Attempts(id, call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.attempts[id+" "+call]
}

// attempt counts a call (under f.mu) and returns the error FailCalls set for it.
func (f *FakeEdge) attempt(id, call string) error {
	key := id + " " + call
	f.attempts[key]++

	return f.fail[key]
}

// Add puts a machine at site, running its agent (a freshly joined machine).
func (f *FakeEdge) Add(id, site string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.machines[id] = &Machine{Site: site, Power: true, Agent: true, Booted: "agent"}
}

func (f *FakeEdge) SetOffline(site string, offline bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.offline[site] = offline
}

// Offline reports whether site is offline (SetOffline).
func (f *FakeEdge) Offline(site string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.offline[site]
}

// SetBMCDead makes a machine's BMC stop answering (dead true) or answer again: every BMC call fails as a call
// the edge gave up on does, while its agent, if running, still answers.
func (f *FakeEdge) SetBMCDead(id string, dead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.deadBMC[id] = dead
}

// HoldAcks makes Push wait for release to be closed before acknowledging (nil: acknowledge at once).
func (f *FakeEdge) HoldAcks(release chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.holdAck = release
}

// HoldWipes makes WipeDisks wait for release to be closed (or its context to end, as a real agent call does)
// before the disks are wiped: a long wipe still running when something else happens.
func (f *FakeEdge) HoldWipes(release chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.holdWipe = release
}

// DropAfterNextAck makes site go offline right after its edge acknowledges the next plan: the WAN link
// breaking in the middle of an operation.
func (f *FakeEdge) DropAfterNextAck(site string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.dropAt[site] = true
}

// Log returns every call logged so far.
func (f *FakeEdge) Log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	return append([]string(nil), f.log...)
}

func (f *FakeEdge) record(id, call string) {
	f.log = append(f.log, id+" "+call)
}

// Calls returns the logged calls of machine id whose name starts with prefix.
func (f *FakeEdge) Calls(id, prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	var out []string

	for _, l := range f.log {
		if rest, ok := strings.CutPrefix(l, id+" "); ok && strings.HasPrefix(rest, prefix) {
			out = append(out, rest)
		}
	}

	return out
}

// StatusReads returns how many times machine id's power status was asked for.
func (f *FakeEdge) StatusReads(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.statusReads[id]
}

// Count returns how many calls of machine id start with prefix.
func (f *FakeEdge) Count(id, prefix string) int { return len(f.Calls(id, prefix)) }

// Machine returns a snapshot of machine id.
func (f *FakeEdge) Machine(id string) Machine {
	f.mu.Lock()
	defer f.mu.Unlock()

	return *f.machines[id]
}

// PullPlug turns machine id off behind the controller's back (a person at the rack, a power failure).
func (f *FakeEdge) PullPlug(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	m := f.machines[id]
	m.Power, m.Agent, m.Booted = false, false, ""
}

// SetAgent plays machine id's agent exiting (false: its tunnel closes, the machine stays on) or coming back
// (true: Talos restarted it), with no reboot.
func (f *FakeEdge) SetAgent(id string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.machines[id].Agent = up
}

// InstallToDisk plays the Talos installer finishing on machine id.
func (f *FakeEdge) InstallToDisk(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.machines[id].OnDisk = true
}

func (f *FakeEdge) get(site, id string) (*Machine, error) {
	m, ok := f.machines[id]

	switch {
	case f.offline[site]:
		return nil, fmt.Errorf("site %s: %w", site, machines.ErrSiteOffline)
	case !ok || m.Site != site:
		return nil, fmt.Errorf("machine %s is not at site %s", id, site)
	}

	return m, nil
}

// bmc is get for a call to the machine's BMC.
func (f *FakeEdge) bmc(site, id string) (*Machine, error) {
	m, err := f.get(site, id)
	if err == nil && f.deadBMC[id] {
		return nil, status.Errorf(codes.DeadlineExceeded, "bmc of %s did not answer", id)
	}

	return m, err
}

// boot models a machine starting: PXE-once boots the acknowledged plan; otherwise it boots its disk if Talos is
// installed, or network boots the acknowledged plan.
func (m *Machine) boot() {
	mode := "disk"

	switch {
	case m.Image != "": // as firmware that prefers removable media does
		mode = m.Image
	case m.PXEOnce || !m.OnDisk:
		mode = string(m.Acked.Mode)
		if !m.AckedSeen {
			mode = string(bootplans.ModeAgent) // unknown machines boot agent mode
		}

		if mode == string(bootplans.ModeDisk) && !m.OnDisk {
			mode = "nothing"
		}
	}

	m.PXEOnce = false
	m.Power = true
	m.Booted = mode
	m.Agent = mode == string(bootplans.ModeAgent)
}

// Locate implements lifecycle.SiteLocator.
func (f *FakeEdge) Locate(id string) (machines.Location, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, ok := f.machines[id]
	if !ok {
		return machines.Location{}, false
	}

	return machines.Location{SiteID: m.Site, AgentConnected: m.Agent && m.Power, Alert: m.Alert, SecureBoot: m.SecureBoot}, true
}

// SetSecureBoot implements lifecycle.SecureBootReports: what the machine's BMC said, as Locate reports it.
func (f *FakeEdge) SetSecureBoot(id metal.ID, s bootpb.SecureBoot) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if m, ok := f.machines[id.String()]; ok {
		m.SecureBoot = s
	}
}

// SetReach sets how a site's machines reach its edge (nil: not said), as its acknowledgements would say it.
func (f *FakeEdge) SetReach(site string, r *bootpb.Reach) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if f.reach == nil {
		f.reach = map[string]*bootpb.Reach{}
	}

	f.reach[site] = r
}

// Reach implements lifecycle.SiteReach.
func (f *FakeEdge) Reach(site string) *bootpb.Reach {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.reach[site]
}

// SetAlert sets the identity alert Locate reports for a machine ("" clears it).
func (f *FakeEdge) SetAlert(id, alert string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if m, ok := f.machines[id]; ok {
		m.Alert = alert
	}
}

// Holds implements lifecycle.PlanPusher: the machine is at site and its edge acknowledged this plan last.
func (f *FakeEdge) Holds(site string, plan bootplans.Plan) bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, ok := f.machines[plan.MachineID.String()]

	return ok && m.Site == site && m.AckedSeen && m.Acked.Equal(plan)
}

// Push implements lifecycle.PlanPusher.
func (f *FakeEdge) Push(ctx context.Context, site string, plan bootplans.Plan) (uint64, error) {
	f.mu.Lock()
	hold := f.holdAck

	if f.offline[site] {
		f.mu.Unlock()

		return 0, fmt.Errorf("push to %s: %w", site, machines.ErrSiteOffline)
	}

	f.record(plan.MachineID.String(), "Push "+string(plan.Mode))
	f.mu.Unlock()

	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	f.version++

	if m, ok := f.machines[plan.MachineID.String()]; ok && m.Site == site {
		m.Acked = plan
		m.AckedSeen = true
	}

	f.record(plan.MachineID.String(), "Ack "+string(plan.Mode))

	if f.dropAt[site] {
		delete(f.dropAt, site)
		f.offline[site] = true
	}

	return f.version, nil
}

// PowerStatus implements lifecycle.PowerClient.
func (f *FakeEdge) PowerStatus(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) (machines.PowerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.statusReads[id]++

	if err := f.attempt(id, "PowerStatus"); err != nil {
		return machines.PowerUnknown, err
	}

	m, err := f.bmc(site, id)
	if err != nil {
		return machines.PowerUnknown, err
	}

	if m.Power {
		return machines.PowerOn, nil
	}

	return machines.PowerOff, nil
}

// Power implements lifecycle.PowerClient: on or cycled, the machine boots (see boot); off, it stops. Every call
// is logged and failed (FailCalls) under the edge's method name ("PowerOn", "PowerOff", "PowerCycle"), and one
// that carries an intent ID goes through the intent store (UseIntents) as at the edge.
func (f *FakeEdge) Power(ctx context.Context, site, id string, _ *specs.BMCConfigurationSpec, a machineaccess.PowerAction) error {
	method, err := powerMethod(a)
	if err != nil {
		return err
	}

	call := method[strings.LastIndexByte(method, '/')+1:]

	f.mu.Lock()
	err = f.attempt(id, call)
	f.mu.Unlock()

	if err != nil {
		return err
	}

	return f.once(ctx, id, call, method, func(context.Context) error {
		f.mu.Lock()
		defer f.mu.Unlock()

		m, err := f.bmc(site, id)
		if err != nil {
			return err
		}

		if a == machineaccess.PowerOff {
			f.record(id, call)
			m.Power, m.Agent, m.Booted = false, false, ""

			return nil
		}

		f.record(id, fmt.Sprintf("%s acked=%s pxe=%v", call, m.Acked.Mode, m.PXEOnce))
		m.boot()

		return nil
	})
}

// powerMethod is the edge's BMC method that carries out a.
func powerMethod(a machineaccess.PowerAction) (string, error) {
	switch a {
	case machineaccess.PowerOn:
		return bmcpb.BMC_PowerOn_FullMethodName, nil
	case machineaccess.PowerOff:
		return bmcpb.BMC_PowerOff_FullMethodName, nil
	case machineaccess.PowerCycle:
		return bmcpb.BMC_PowerCycle_FullMethodName, nil
	default:
		return "", fmt.Errorf("unknown power action %d", int(a))
	}
}

// BootFromImage implements lifecycle.PowerClient: the image holds the acknowledged plan.
func (f *FakeEdge) BootFromImage(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "BootFromImage"); err != nil {
		return "", err
	}

	m, err := f.bmc(site, id)
	if err != nil {
		return "", err
	}

	if !m.AckedSeen || m.Acked.Mode == bootplans.ModeDisk || m.Acked.Mode == bootplans.ModeDeny {
		return "", fmt.Errorf("machine %s: no image for plan %q", id, m.Acked.Mode)
	}

	f.record(id, "BootFromImage "+string(m.Acked.Mode))
	m.Image = string(m.Acked.Mode)

	return "10.9.0.7/24", nil
}

// EjectImage implements lifecycle.PowerClient.
func (f *FakeEdge) EjectImage(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "EjectImage"); err != nil {
		return err
	}

	m, err := f.bmc(site, id)
	if err != nil {
		return err
	}

	f.record(id, "EjectImage")
	m.Image = ""

	return nil
}

// SetPXEOnce implements lifecycle.PowerClient.
func (f *FakeEdge) SetPXEOnce(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "SetPXEOnce"); err != nil {
		return err
	}

	m, err := f.bmc(site, id)
	if err != nil {
		return err
	}

	f.record(id, "SetPXEOnce")
	m.PXEOnce = true

	return nil
}

func (f *FakeEdge) agentMachine(site, id string) (*Machine, error) {
	m, err := f.get(site, id)
	if err != nil {
		return nil, err
	}

	if !m.Power || !m.Agent {
		return nil, fmt.Errorf("agent of %s: %w", id, machines.ErrSiteOffline)
	}

	return m, nil
}

// Hello implements lifecycle.AgentClient.
func (f *FakeEdge) Hello(_ context.Context, site, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "Hello"); err != nil {
		return err
	}

	if _, err := f.agentMachine(site, id); err != nil {
		return err
	}

	f.record(id, "Hello")

	return nil
}

// GetPowerManagement implements lifecycle.AgentClient.
func (f *FakeEdge) GetPowerManagement(_ context.Context, site, id string, _ *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "GetPowerManagement"); err != nil {
		return nil, err
	}

	m, err := f.agentMachine(site, id)
	if err != nil {
		return nil, err
	}

	f.record(id, "GetPowerManagement")

	return &agentpb.GetPowerManagementResponse{Ipmi: &agentpb.GetPowerManagementResponse_IPMI{
		Address: "10.0.0." + id[len(id)-1:], Port: 623, UserExists: m.IPMIUser != "",
	}}, nil
}

// SetPowerManagement implements lifecycle.AgentClient.
func (f *FakeEdge) SetPowerManagement(_ context.Context, site, id string, req *agentpb.SetPowerManagementRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "SetPowerManagement"); err != nil {
		return err
	}

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	f.record(id, "SetPowerManagement "+req.GetIpmi().GetUsername())
	m.IPMIUser, m.IPMIPass = req.GetIpmi().GetUsername(), req.GetIpmi().GetPassword()

	return nil
}

// WipeDisks implements lifecycle.AgentClient. A call that carries an intent ID goes through the intent store
// (UseIntents) as at the edge.
func (f *FakeEdge) WipeDisks(ctx context.Context, site, id string, zeroes bool) error {
	f.mu.Lock()
	err := f.attempt(id, "WipeDisks")
	f.mu.Unlock()

	if err != nil {
		return err
	}

	return f.once(ctx, id, "WipeDisks", "/management.AgentService/WipeDisks", func(ctx context.Context) error {
		return f.wipe(ctx, site, id, zeroes)
	})
}

func (f *FakeEdge) wipe(ctx context.Context, site, id string, zeroes bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	if zeroes {
		f.record(id, "WipeDisks zeroes")
	} else {
		f.record(id, "WipeDisks")
	}

	if hold := f.holdWipe; hold != nil {
		f.mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
		}
		f.mu.Lock()

		if ctx.Err() != nil {
			return fmt.Errorf("wipe of %s interrupted: %w", id, ctx.Err())
		}
	}

	m.OnDisk = false

	return nil
}

// Reboot implements lifecycle.AgentClient.
func (f *FakeEdge) Reboot(_ context.Context, site, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.attempt(id, "Reboot"); err != nil {
		return err
	}

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	f.record(id, "AgentReboot")
	m.boot()

	return nil
}

// FakeResolver resolves every profile to local-looking URLs; a Secure Boot profile also to a signed image
// named by its schematic (its kernel arguments baked in), as the image factory does.
type FakeResolver struct{}

// Resolve implements assets.Resolver.
func (FakeResolver) Resolve(_ context.Context, p assets.Profile) (assets.Boot, error) {
	base := "http://assets/" + p.TalosVersion + "/" + p.Arch.String()
	b := assets.Boot{KernelURL: base + "/vmlinuz", InitrdURL: base + "/initramfs.xz", KernelArgs: p.KernelArgs}

	if p.SecureBoot {
		id, err := p.Schematic().ID()
		if err != nil {
			return assets.Boot{}, err
		}

		b.SignedSchematicID, b.SignedURL = id, base+"/"+id+"/secureboot-uki.efi"
	}

	return b, nil
}
