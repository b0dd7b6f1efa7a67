package lifecycle

import (
	"context"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// timedPower and timedAgent time every call the lifecycle makes through an edge into Metrics, labelled by call.
type timedPower struct {
	next PowerClient
	m    *Metrics
}

// timed runs one call and times it into m.
func timed(m *Metrics, call string, fn func() error) error {
	_, err := timedValue(m, call, func() (struct{}, error) { return struct{}{}, fn() })

	return err
}

// timedValue runs one call with a result and times it into m.
func timedValue[T any](m *Metrics, call string, fn func() (T, error)) (T, error) {
	start := time.Now()
	v, err := fn()
	m.called(call, start, err)

	return v, err
}

func (p timedPower) PowerStatus(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (machines.PowerState, error) {
	return timedValue(p.m, "power_status", func() (machines.PowerState, error) { return p.next.PowerStatus(ctx, site, id, bmc) })
}

func (p timedPower) Power(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec, a machineaccess.PowerAction) error {
	return timed(p.m, a.String(), func() error { return p.next.Power(ctx, site, id, bmc, a) })
}

func (p timedPower) SetPXEOnce(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	return timed(p.m, "set_pxe_once", func() error { return p.next.SetPXEOnce(ctx, site, id, bmc) })
}

func (p timedPower) BootFromImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (string, error) {
	return timedValue(p.m, "boot_from_image", func() (string, error) { return p.next.BootFromImage(ctx, site, id, bmc) })
}

func (p timedPower) EjectImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	return timed(p.m, "eject_image", func() error { return p.next.EjectImage(ctx, site, id, bmc) })
}

type timedAgent struct {
	next AgentClient
	m    *Metrics
}

func (a timedAgent) Hello(ctx context.Context, site, id string) error {
	return timed(a.m, "agent_hello", func() error { return a.next.Hello(ctx, site, id) })
}

func (a timedAgent) GetPowerManagement(ctx context.Context, site, id string, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	return timedValue(a.m, "agent_get_power_management", func() (*agentpb.GetPowerManagementResponse, error) {
		return a.next.GetPowerManagement(ctx, site, id, req)
	})
}

func (a timedAgent) SetPowerManagement(ctx context.Context, site, id string, req *agentpb.SetPowerManagementRequest) error {
	return timed(a.m, "agent_set_power_management", func() error { return a.next.SetPowerManagement(ctx, site, id, req) })
}

func (a timedAgent) WipeDisks(ctx context.Context, site, id string, zeroes bool) error {
	return timed(a.m, "agent_wipe_disks", func() error { return a.next.WipeDisks(ctx, site, id, zeroes) })
}

func (a timedAgent) Reboot(ctx context.Context, site, id string) error {
	return timed(a.m, "agent_reboot", func() error { return a.next.Reboot(ctx, site, id) })
}
