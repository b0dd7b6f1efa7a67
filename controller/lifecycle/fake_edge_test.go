package lifecycle_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// fakeMachine is a machine as the fake edge models it.
type fakeMachine struct {
	site      string
	power     bool
	agent     bool
	pxeOnce   bool
	onDisk    bool   // Talos installed on disk (the machine boots it without PXE)
	booted    string // mode the machine last booted into
	ipmiUser  string
	ipmiPass  string
	acked     bootplans.Plan
	ackedSeen bool
}

// fakeEdge models the sites' edges: machines with power, PXE-once flag, agent and acknowledged plans.
// It logs every call as "<machine> <Call> [detail]" so tests assert on order and counts.
type fakeEdge struct {
	mu       sync.Mutex
	machines map[string]*fakeMachine
	offline  map[string]bool
	version  uint64
	log      []string
	holdAck  chan struct{} // when non-nil, Push waits for a value before acknowledging
}

func newFakeEdge() *fakeEdge {
	return &fakeEdge{machines: map[string]*fakeMachine{}, offline: map[string]bool{}}
}

// add puts a machine at site, running its agent (a freshly joined machine).
func (f *fakeEdge) add(id, site string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.machines[id] = &fakeMachine{site: site, power: true, agent: true, booted: "agent"}
}

func (f *fakeEdge) setOffline(site string, offline bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.offline[site] = offline
}

func (f *fakeEdge) record(id, call string) {
	f.log = append(f.log, id+" "+call)
}

// calls returns the logged calls of machine id whose name starts with prefix.
func (f *fakeEdge) calls(id, prefix string) []string {
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

func (f *fakeEdge) count(id, prefix string) int { return len(f.calls(id, prefix)) }

func (f *fakeEdge) machine(id string) fakeMachine {
	f.mu.Lock()
	defer f.mu.Unlock()

	return *f.machines[id]
}

// installToDisk plays the Talos installer finishing.
func (f *fakeEdge) installToDisk(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.machines[id].onDisk = true
}

func (f *fakeEdge) get(site, id string) (*fakeMachine, error) {
	m, ok := f.machines[id]

	switch {
	case f.offline[site]:
		return nil, fmt.Errorf("site %s: %w", site, lifecycle.ErrSiteOffline)
	case !ok || m.site != site:
		return nil, fmt.Errorf("machine %s is not at site %s", id, site)
	}

	return m, nil
}

// boot models a machine starting: PXE-once boots the acknowledged plan; otherwise it boots its disk if Talos is
// installed, or network boots the acknowledged plan.
func (m *fakeMachine) boot() {
	mode := "disk"

	if m.pxeOnce || !m.onDisk {
		mode = string(m.acked.Mode)
		if !m.ackedSeen {
			mode = string(bootplans.ModeAgent) // unknown machines boot agent mode
		}

		if mode == string(bootplans.ModeDisk) && !m.onDisk {
			mode = "nothing"
		}
	}

	m.pxeOnce = false
	m.power = true
	m.booted = mode
	m.agent = mode == string(bootplans.ModeAgent)
}

// Locate implements lifecycle.SiteLocator.
func (f *fakeEdge) Locate(id string) (lifecycle.Location, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, ok := f.machines[id]
	if !ok {
		return lifecycle.Location{}, false
	}

	return lifecycle.Location{SiteID: m.site, AgentConnected: m.agent && m.power}, true
}

// Site implements bootplans.SiteDirectory.
func (f *fakeEdge) Site(id string) (bootplans.Site, error) {
	return bootplans.Site{ConfigURL: "http://" + id + ".edge/config", AgentAddress: id + ".edge:8081"}, nil
}

// Push implements lifecycle.PlanPusher.
func (f *fakeEdge) Push(ctx context.Context, site string, plan bootplans.Plan) (uint64, error) {
	f.mu.Lock()
	hold := f.holdAck

	if f.offline[site] {
		f.mu.Unlock()

		return 0, fmt.Errorf("push to %s: %w", site, lifecycle.ErrSiteOffline)
	}

	f.record(plan.MachineID, "Push "+string(plan.Mode))
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

	if m, ok := f.machines[plan.MachineID]; ok && m.site == site {
		m.acked = plan
		m.ackedSeen = true
	}

	f.record(plan.MachineID, "Ack "+string(plan.Mode))

	return f.version, nil
}

func (f *fakeEdge) PowerStatus(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) (lifecycle.PowerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.get(site, id)
	if err != nil {
		return lifecycle.PowerUnknown, err
	}

	if m.power {
		return lifecycle.PowerOn, nil
	}

	return lifecycle.PowerOff, nil
}

func (f *fakeEdge) PowerOn(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.get(site, id)
	if err != nil {
		return err
	}

	f.record(id, fmt.Sprintf("PowerOn acked=%s pxe=%v", m.acked.Mode, m.pxeOnce))
	m.boot()

	return nil
}

func (f *fakeEdge) PowerOff(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.get(site, id)
	if err != nil {
		return err
	}

	f.record(id, "PowerOff")
	m.power, m.agent, m.booted = false, false, ""

	return nil
}

func (f *fakeEdge) PowerCycle(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.get(site, id)
	if err != nil {
		return err
	}

	f.record(id, fmt.Sprintf("PowerCycle acked=%s pxe=%v", m.acked.Mode, m.pxeOnce))
	m.boot()

	return nil
}

func (f *fakeEdge) SetPXEOnce(_ context.Context, site, id string, _ *specs.BMCConfigurationSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.get(site, id)
	if err != nil {
		return err
	}

	f.record(id, "SetPXEOnce")
	m.pxeOnce = true

	return nil
}

func (f *fakeEdge) agentMachine(site, id string) (*fakeMachine, error) {
	m, err := f.get(site, id)
	if err != nil {
		return nil, err
	}

	if !m.power || !m.agent {
		return nil, fmt.Errorf("agent of %s: %w", id, lifecycle.ErrSiteOffline)
	}

	return m, nil
}

func (f *fakeEdge) Hello(_ context.Context, site, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	_, err := f.agentMachine(site, id)

	return err
}

func (f *fakeEdge) GetPowerManagement(_ context.Context, site, id string, _ *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.agentMachine(site, id)
	if err != nil {
		return nil, err
	}

	f.record(id, "GetPowerManagement")

	return &agentpb.GetPowerManagementResponse{Ipmi: &agentpb.GetPowerManagementResponse_IPMI{
		Address: "10.0.0." + id[len(id)-1:], Port: 623, UserExists: m.ipmiUser != "",
	}}, nil
}

func (f *fakeEdge) SetPowerManagement(_ context.Context, site, id string, req *agentpb.SetPowerManagementRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	f.record(id, "SetPowerManagement "+req.GetIpmi().GetUsername())
	m.ipmiUser, m.ipmiPass = req.GetIpmi().GetUsername(), req.GetIpmi().GetPassword()

	return nil
}

func (f *fakeEdge) WipeDisks(_ context.Context, site, id string, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	f.record(id, "WipeDisks")
	m.onDisk = false

	return nil
}

func (f *fakeEdge) Reboot(_ context.Context, site, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()

	m, err := f.agentMachine(site, id)
	if err != nil {
		return err
	}

	f.record(id, "AgentReboot")
	m.boot()

	return nil
}

// fakeResolver resolves every profile to local-looking URLs.
type fakeResolver struct{}

func (fakeResolver) Resolve(_ context.Context, p assets.Profile) (assets.Boot, error) {
	base := "http://assets/" + p.TalosVersion + "/" + p.Arch

	return assets.Boot{KernelURL: base + "/vmlinuz", InitrdURL: base + "/initramfs.xz", KernelArgs: p.KernelArgs}, nil
}
