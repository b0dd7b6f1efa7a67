package lifecycle

import (
	"context"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// timedPower and timedAgent time every call the lifecycle makes through an edge into Metrics.
type timedPower struct {
	next PowerClient
	m    *Metrics
}

func (p timedPower) PowerStatus(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (PowerState, error) {
	start := time.Now()
	ps, err := p.next.PowerStatus(ctx, site, id, bmc)
	p.m.called("power_status", start, err)

	return ps, err
}

func (p timedPower) PowerOn(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	start := time.Now()
	err := p.next.PowerOn(ctx, site, id, bmc)
	p.m.called("power_on", start, err)

	return err
}

func (p timedPower) PowerOff(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	start := time.Now()
	err := p.next.PowerOff(ctx, site, id, bmc)
	p.m.called("power_off", start, err)

	return err
}

func (p timedPower) PowerCycle(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	start := time.Now()
	err := p.next.PowerCycle(ctx, site, id, bmc)
	p.m.called("power_cycle", start, err)

	return err
}

func (p timedPower) SetPXEOnce(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	start := time.Now()
	err := p.next.SetPXEOnce(ctx, site, id, bmc)
	p.m.called("set_pxe_once", start, err)

	return err
}

func (p timedPower) BootFromImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (string, error) {
	start := time.Now()
	addr, err := p.next.BootFromImage(ctx, site, id, bmc)
	p.m.called("boot_from_image", start, err)

	return addr, err
}

func (p timedPower) EjectImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	start := time.Now()
	err := p.next.EjectImage(ctx, site, id, bmc)
	p.m.called("eject_image", start, err)

	return err
}

type timedAgent struct {
	next AgentClient
	m    *Metrics
}

func (a timedAgent) Hello(ctx context.Context, site, id string) error {
	start := time.Now()
	err := a.next.Hello(ctx, site, id)
	a.m.called("agent_hello", start, err)

	return err
}

func (a timedAgent) GetPowerManagement(ctx context.Context, site, id string, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	start := time.Now()
	resp, err := a.next.GetPowerManagement(ctx, site, id, req)
	a.m.called("agent_get_power_management", start, err)

	return resp, err
}

func (a timedAgent) SetPowerManagement(ctx context.Context, site, id string, req *agentpb.SetPowerManagementRequest) error {
	start := time.Now()
	err := a.next.SetPowerManagement(ctx, site, id, req)
	a.m.called("agent_set_power_management", start, err)

	return err
}

func (a timedAgent) WipeDisks(ctx context.Context, site, id string, zeroes bool) error {
	start := time.Now()
	err := a.next.WipeDisks(ctx, site, id, zeroes)
	a.m.called("agent_wipe_disks", start, err)

	return err
}

func (a timedAgent) Reboot(ctx context.Context, site, id string) error {
	start := time.Now()
	err := a.next.Reboot(ctx, site, id)
	a.m.called("agent_reboot", start, err)

	return err
}
