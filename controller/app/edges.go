package app

import (
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"

	"context"

	"github.com/outpost-metal/outpost/controller/bootevents"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/sites"
)

// edgeWiring is everything between the lifecycle and the edges: where machines are (learned from edge
// events), the boot tables pushed to sites, the BMCs each edge watches, and the clients for BMCs and agents.
//
// Agent tunnels are not forgotten when a session ends: the edge journals tunnel closes and delivers them in
// order after reconnecting, so the controller's view stays right across a WAN outage without rebooting
// machines whose agents never left.
type edgeWiring struct {
	// bmcProtocol is the controller's --bmc-protocol, parsed.
	bmcProtocol bmcpb.Protocol
	locations   *lifecycle.Locations
	watches     *lifecycle.WatchLists
	receiver    *bootevents.Receiver
	tables      *boottables.Tables
	// policies are the sites' own BMC protocols and wipe methods (controller site set).
	policies *lifecycle.SitePolicies
	// clients reach machines through their site's session; built once the uplink server exists.
	clients *lifecycle.EdgeClients
}

// newEdgeWiring builds what the uplink server's sessions need (its services and session functions); the
// clients, which need the server, come after it (newMachineAccess).
func (b *builder) newEdgeWiring(context.Context) error {
	locations := lifecycle.NewLocations(b.log)
	policies := lifecycle.NewSitePolicies()

	// The controller's BMC protocol, parsed once (the configuration was checked).
	protocol, err := lifecycle.ParseBMCProtocol(b.cfg.BMCProtocol)
	if err != nil {
		return err
	}

	b.edges = &edgeWiring{
		bmcProtocol: protocol,
		locations:   locations,
		watches:     lifecycle.NewWatchLists(b.log, protocol, policies, locations),
		receiver:    bootevents.NewReceiver(b.log, locations, sites.SiteFromContext).WithInventory(locations),
		tables:      boottables.New(b.log, nil),
		policies:    policies,
	}

	return nil
}

// newMachineAccess builds the BMC and agent clients over the uplink server's site sessions.
func (b *builder) newMachineAccess(context.Context) error {
	b.edges.clients = &lifecycle.EdgeClients{
		Access:          machineaccess.New(b.uplink.Conn, b.edges.locations),
		Sites:           b.edges.locations,
		DefaultBootMode: b.cfg.DefaultBootMode,
		BMCProtocol:     b.edges.bmcProtocol,
		Policies:        b.edges.policies,
	}

	return nil
}
