package lifecycle

import (
	"context"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// PowerClient reaches a machine's BMC through its site's edge. Credentials travel with every call.
type PowerClient interface {
	PowerStatus(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) (machines.PowerState, error)
	// Power has the BMC power the machine on, off, or cycle it (a machine that is off: on).
	Power(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec, a machineaccess.PowerAction) error
	// SetPXEOnce makes the next boot a network boot.
	SetPXEOnce(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) error
	// BootFromImage makes the next boot one from the virtual-media image of the machine's plan (a site without
	// DHCP); it returns the static address the image brings up.
	BootFromImage(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) (string, error)
	// EjectImage empties the machine's virtual CD, so that it boots its disk.
	EjectImage(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) error
}

// AgentClient calls the metal agent of a machine through its site's edge (management.AgentService).
type AgentClient interface {
	Hello(ctx context.Context, siteID, machineID string) error
	GetPowerManagement(ctx context.Context, siteID, machineID string, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error)
	SetPowerManagement(ctx context.Context, siteID, machineID string, req *agentpb.SetPowerManagementRequest) error
	WipeDisks(ctx context.Context, siteID, machineID string, zeroes bool) error
	Reboot(ctx context.Context, siteID, machineID string) error
}

// SiteLocator tells which site a machine is at (machines.Locations).
type SiteLocator interface {
	Locate(machineID string) (machines.Location, bool)
}

// PlanPusher hands a machine's boot plan to its site's edge and returns once the edge acknowledged the
// version holding it (boottables.Tables). Holds tells, without waiting, whether the edge acknowledged the plan
// already, so an unchanged plan is not handed over again.
type PlanPusher interface {
	Push(ctx context.Context, siteID string, plan bootplans.Plan) (version uint64, err error)
	Holds(siteID string, plan bootplans.Plan) bool
}

// SiteReach says how a site's machines reach its edge (boottables.Tables; nil: not known yet).
type SiteReach interface {
	Reach(siteID string) *bootpb.Reach
}

// Planner computes a machine's boot plan (bootplans.Planner).
type Planner interface {
	Plan(ctx context.Context, m bootplans.Machine) (bootplans.Plan, error)
}
