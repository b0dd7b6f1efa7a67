package lifecycle

import (
	"context"
	"errors"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// ErrSiteOffline is what edge clients return (wrapped) when the machine's site has no live session;
// the lifecycle then waits and retries, never acting elsewhere.
var ErrSiteOffline = errors.New("site offline")

// PowerState is a machine's power state as its BMC reports it.
type PowerState int

// Power states.
const (
	PowerUnknown PowerState = iota
	PowerOff
	PowerOn
)

// PowerClient reaches a machine's BMC through its site's edge. Credentials travel with every call.
type PowerClient interface {
	PowerStatus(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) (PowerState, error)
	PowerOn(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) error
	PowerOff(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) error
	PowerCycle(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) error
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

// Location is where a machine was last seen, as learned from edge events.
type Location struct {
	SiteID string
	// AgentConnected is true while the machine's agent tunnel is open at that site's edge.
	AgentConnected bool
	// Arch is the machine's architecture as its network boot reported it ("amd64", "arm64"; "" when unknown).
	Arch string
	// Firmware is "bios" or "uefi" as the machine's PXE request reported it ("" when unknown).
	Firmware string
	// FirmwareSource says where Firmware came from: "ipxe" (its own boot script request), "dhcp", "operator".
	FirmwareSource string
	// MACs are the interfaces the machine was seen booting from.
	MACs []string
	// LastSeen is when its site's edge last reported it.
	LastSeen time.Time
	// Power is the power state its site's edge last reported from watching its BMC ("on", "off", "unknown";
	// "" when none), at PowerAt; PowerReason says why it is unknown.
	Power       string
	PowerAt     time.Time
	PowerReason string
	// Alert says what is wrong with the machine's identity ("" when nothing; see the Alert constants), raised
	// last at AlertAt; it stays until the machine's own agent tunnel opens again (a contested UUID: until an
	// operator clears it).
	Alert   string
	AlertAt time.Time
}

// Alerts: what a machine's Alert says.
const (
	AlertTunnelContested   = "tunnel-contested"
	AlertTunnelOtherSource = "tunnel-from-other-address"
	AlertSecondTunnel      = "second-tunnel"
	AlertClaimedElsewhere  = "claimed-by-other-site"
)

// SiteLocator tells which site a machine is at.
type SiteLocator interface {
	Locate(machineID string) (Location, bool)
}

// PlanPusher hands a machine's boot plan to its site's edge and returns once the edge acknowledged the
// version holding it (boottables.Tables). Holds tells, without waiting, whether the edge acknowledged the plan
// already, so an unchanged plan is not handed over again.
type PlanPusher interface {
	Push(ctx context.Context, siteID string, plan bootplans.Plan) (version uint64, err error)
	Holds(siteID string, plan bootplans.Plan) bool
}

// Planner computes a machine's boot plan (bootplans.Planner).
type Planner interface {
	Plan(ctx context.Context, m bootplans.Machine) (bootplans.Plan, error)
}
