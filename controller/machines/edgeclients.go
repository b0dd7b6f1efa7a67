package machines

import (
	"context"
	"errors"
	"fmt"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrNoIPMI means the machine's power management is not something the edge's BMC service can drive.
var ErrNoIPMI = errors.New("machine has no ipmi bmc configuration")

// EdgeClients implements PowerClient and AgentClient over machineaccess (the sites' uplink sessions).
// An unreachable site surfaces as ErrSiteOffline.
type EdgeClients struct {
	Access *machineaccess.Client
	// Sites tells the firmware mode for one-time PXE boots (optional).
	Sites *Locations
	// DefaultBootMode is the firmware mode of a one-time PXE boot of a machine whose firmware nothing has
	// reported (no boot through the edge yet, no BMC that says): "uefi" (the default when empty) or "bios".
	DefaultBootMode metal.Firmware
	// BMCProtocol is how the edge talks to BMCs (the controller's setting; the zero value
	// is auto: Redfish when it answers, else IPMI); a site's own (Policies) comes first.
	BMCProtocol bmcpb.Protocol
	// Policies are the sites' own settings (optional).
	Policies *SitePolicies
}

// classify marks a failed call as ErrSiteOffline when it failed because the site has no live session.
// Unavailable alone does not say that: the edge answers Unavailable itself for a BMC that does not answer
// or a machine without an agent tunnel, and calling those "site offline" would send an operator to the
// wrong place.
func (c *EdgeClients) classify(site string, err error) error {
	if status.Code(err) == codes.Unavailable && !c.Access.Online(site) {
		return fmt.Errorf("%w: %w", ErrSiteOffline, err)
	}

	return err
}

// target is the BMC of a machine as the edge's BMC service takes it. The same credentials serve IPMI and
// Redfish (BMCs keep one user database); with auto the edge probes Redfish and falls back to IPMI.
func target(bmc *specs.BMCConfigurationSpec, proto bmcpb.Protocol) (*bmcpb.Target, error) {
	ipmi := bmc.GetIpmi()
	if ipmi == nil {
		return nil, ErrNoIPMI
	}

	return &bmcpb.Target{
		Host: ipmi.GetAddress(), IpmiPort: ipmi.GetPort(), Protocol: proto,
		Username: ipmi.GetUsername(), Password: ipmi.GetPassword(),
	}, nil
}

func (c *EdgeClients) bmc(site, id string, bmc *specs.BMCConfigurationSpec) (*machineaccess.BMC, error) {
	t, err := target(bmc, c.Policies.BMCProtocol(site, c.BMCProtocol))
	if err != nil {
		return nil, fmt.Errorf("bmc of %s: %w", id, err)
	}

	return c.Access.BMC(site, id, t), nil
}

// PowerStatus implements PowerClient.
func (c *EdgeClients) PowerStatus(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (PowerState, error) {
	b, err := c.bmc(site, id, bmc)
	if err != nil {
		return PowerUnknown, err
	}

	on, err := b.PowerStatus(ctx)
	if err != nil {
		return PowerUnknown, c.classify(site, err)
	}

	if on {
		return PowerOn, nil
	}

	return PowerOff, nil
}

func (c *EdgeClients) do(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec, op func(*machineaccess.BMC, context.Context) error) error {
	b, err := c.bmc(site, id, bmc)
	if err != nil {
		return err
	}

	return c.classify(site, op(b, ctx))
}

// Power implements PowerClient.
func (c *EdgeClients) Power(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec, a machineaccess.PowerAction) error {
	return c.do(ctx, site, id, bmc, func(b *machineaccess.BMC, ctx context.Context) error { return b.Power(ctx, a) })
}

// BootFromImage implements PowerClient.
func (c *EdgeClients) BootFromImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (string, error) {
	var addr string

	err := c.do(ctx, site, id, bmc, func(b *machineaccess.BMC, ctx context.Context) error {
		resp, err := b.BootFromImage(ctx, "")
		addr = resp.GetAddress()

		return err
	})

	return addr, err
}

// EjectImage implements PowerClient.
func (c *EdgeClients) EjectImage(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	return c.do(ctx, site, id, bmc, (*machineaccess.BMC).EjectImage)
}

// SetPXEOnce implements PowerClient. The firmware mode comes from what the machine reported (its iPXE boot
// request, its PXE DHCP request); for a machine that never booted through the edge (the site's own DHCP hands
// out the boot file, or it joined another way) the BMC is asked, and failing that the default mode is used.
func (c *EdgeClients) SetPXEOnce(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) error {
	mode := bmcpb.BootMode_BOOT_MODE_UNSPECIFIED

	if c.Sites != nil {
		if loc, ok := c.Sites.ByResourceID().Locate(id); ok {
			mode = bmcpb.BootModeOf(metal.Firmware(loc.Firmware))
		}
	}

	return c.do(ctx, site, id, bmc, func(b *machineaccess.BMC, ctx context.Context) error {
		if mode == bmcpb.BootMode_BOOT_MODE_UNSPECIFIED {
			mode = c.bmcBootMode(ctx, b)
		}

		return b.SetPXEOnce(ctx, mode)
	})
}

// bmcBootMode asks the BMC for the firmware mode it holds: an override in effect says it, and so does a
// stored EFI flag; otherwise the default mode.
func (c *EdgeClients) bmcBootMode(ctx context.Context, b *machineaccess.BMC) bmcpb.BootMode {
	if resp, err := b.GetBootOverride(ctx); err == nil && (resp.GetSet() || resp.GetMode() == bmcpb.BootMode_BOOT_MODE_UEFI) &&
		resp.GetMode() != bmcpb.BootMode_BOOT_MODE_UNSPECIFIED {
		return resp.GetMode()
	}

	if m := bmcpb.BootModeOf(c.DefaultBootMode); m != bmcpb.BootMode_BOOT_MODE_UNSPECIFIED {
		return m
	}

	return bmcpb.BootMode_BOOT_MODE_UEFI
}

// Inventory implements InventoryClient.
func (c *EdgeClients) Inventory(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec) (*bmcpb.InventoryResponse, error) {
	b, err := c.bmc(site, id, bmc)
	if err != nil {
		return nil, err
	}

	inv, err := b.Inventory(ctx)

	return inv, c.classify(site, err)
}

// Hello implements AgentClient.
func (c *EdgeClients) Hello(ctx context.Context, site, id string) error {
	_, err := c.Access.Agent(site, id).Hello(ctx, &agentpb.HelloRequest{})

	return c.classify(site, err)
}

// GetPowerManagement implements AgentClient.
func (c *EdgeClients) GetPowerManagement(ctx context.Context, site, id string, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	resp, err := c.Access.Agent(site, id).GetPowerManagement(ctx, req)

	return resp, c.classify(site, err)
}

// SetPowerManagement implements AgentClient.
func (c *EdgeClients) SetPowerManagement(ctx context.Context, site, id string, req *agentpb.SetPowerManagementRequest) error {
	_, err := c.Access.Agent(site, id).SetPowerManagement(ctx, req)

	return c.classify(site, err)
}

// WipeDisks implements AgentClient.
func (c *EdgeClients) WipeDisks(ctx context.Context, site, id string, zeroes bool) error {
	_, err := c.Access.Agent(site, id).WipeDisks(ctx, &agentpb.WipeDisksRequest{Zeroes: zeroes})

	return c.classify(site, err)
}

// Reboot implements AgentClient.
func (c *EdgeClients) Reboot(ctx context.Context, site, id string) error {
	_, err := c.Access.Agent(site, id).Reboot(ctx, &agentpb.RebootRequest{})

	return c.classify(site, err)
}

// IntentOutcome implements IntentClient. An edge of the release before intents has no Intents service: its
// answer (Unimplemented) is an error, and the intent stays open.
func (c *EdgeClients) IntentOutcome(ctx context.Context, site, id, intentID string) (intentspb.State, error) {
	out, err := c.Access.IntentOutcome(ctx, site, id, intentID)
	if err != nil {
		return intentspb.State_STATE_UNKNOWN, c.classify(site, err)
	}

	return out.GetState(), nil
}
