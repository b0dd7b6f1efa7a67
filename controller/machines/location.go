// Package machines is the controller's edge-side knowledge of machines: where each machine is and how it
// boots (Locations, fed from the edges' events and kept in Omni as MachineLocation records), what each
// site's operator set for it (SitePolicies), which BMCs each site's edge watches (WatchLists), and the
// clients that reach a machine's BMC and agent through its site's session (EdgeClients).
//
// The cut: this package knows machines as the edges see them, in memory and on the wire; package lifecycle
// holds the steps that act on machines in Omni (COSI controllers) and their scheduling, and reads what it
// needs from here through the small interfaces it declares (SiteLocator, PowerClient, AgentClient). lifecycle
// imports machines, never the reverse. Edge events reach Locations through bootevents.Receiver, which hands
// each event to every handler given at construction (the locations, the timelines).
package machines

import (
	"errors"
	"time"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
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

// Location is where a machine was last seen, as learned from edge events.
type Location struct {
	SiteID string
	// AgentConnected is true while the machine's agent tunnel is open at that site's edge.
	AgentConnected bool
	// Arch is the machine's architecture as its network boot reported it ("" when unknown).
	Arch metal.Arch
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
	// SecureBoot is whether the machine's firmware enforces Secure Boot as its BMC last said (unspecified: it
	// never said); SecureBootOverride is an operator's word for the machine (unspecified: none).
	SecureBoot, SecureBootOverride bootpb.SecureBoot
}

// EnforcesSecureBoot is whether the machine's firmware enforces Secure Boot and who said it, first match wins:
// an operator's word for the machine ("operator"), the site's setting ("site"), what its BMC said ("bmc").
// Unspecified and "": nobody said (the edge's own setting decides).
func (l Location) EnforcesSecureBoot(site bootpb.SecureBoot) (bootpb.SecureBoot, string) {
	for _, said := range []struct {
		value  bootpb.SecureBoot
		source string
	}{{l.SecureBootOverride, "operator"}, {site, "site"}, {l.SecureBoot, "bmc"}} {
		if said.value != bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED {
			return said.value, said.source
		}
	}

	return bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, ""
}

// Alerts: what a machine's Alert says.
const (
	AlertTunnelContested   = "tunnel-contested"
	AlertTunnelOtherSource = "tunnel-from-other-address"
	AlertSecondTunnel      = "second-tunnel"
	AlertClaimedElsewhere  = "claimed-by-other-site"
)
