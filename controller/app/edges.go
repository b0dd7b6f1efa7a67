package app

import (
	"context"
	"time"

	"github.com/outpost-metal/outpost/controller/bootevents"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/controller/timeline"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// edgeWiring is everything between the lifecycle and the edges: where machines are (learned from edge
// events, which the receiver hands to the locations and the timelines), the boot tables pushed to sites, the
// BMCs each edge watches, and the clients for BMCs and agents.
//
// Agent tunnels are not forgotten when a session ends: the edge journals tunnel closes and delivers them in
// order after reconnecting, so the controller's view stays right across a WAN outage without rebooting
// machines whose agents never left.
type edgeWiring struct {
	// bmcProtocol is the controller's --bmc-protocol, parsed.
	bmcProtocol bmcpb.Protocol
	locations   *machines.Locations
	watches     *machines.WatchLists
	receiver    *bootevents.Receiver
	tables      *boottables.Tables
	// policies are the sites' own BMC protocols and wipe methods (controller site set).
	policies *machines.SitePolicies
	// clients reach machines through their site's session; built once the uplink server exists.
	clients *machines.EdgeClients
}

// newEdgeWiring builds what the uplink server's sessions need (its services and session functions); the
// clients, which need the server, come after it (newMachineAccess).
func (b *builder) newEdgeWiring(context.Context) error {
	locations := machines.NewLocations(b.log)
	policies := machines.NewSitePolicies()

	// every machine's timeline takes the edges' events beside the locations (and the lifecycle's journal:
	// newStatus); the Omni session loads and keeps it
	b.timelines = timeline.New(timeline.DefaultConfig(), time.Now)

	b.edges = &edgeWiring{
		bmcProtocol: b.cfg.BMCProtocol,
		locations:   locations,
		watches:     machines.NewWatchLists(b.log, b.cfg.BMCProtocol, policies, locations),
		receiver:    bootevents.NewReceiver(b.log, sites.SiteFromContext, locations, b.timelines).WithInventory(locations),
		tables:      boottables.New(b.log, nil),
		policies:    policies,
	}

	return nil
}

// newMachineAccess builds the BMC and agent clients over the uplink server's site sessions.
func (b *builder) newMachineAccess(context.Context) error {
	b.edges.clients = &machines.EdgeClients{
		Access:          machineaccess.New(b.uplink.Conn, b.edges.locations.ByResourceID()),
		Sites:           b.edges.locations,
		DefaultBootMode: b.cfg.DefaultBootMode,
		BMCProtocol:     b.edges.bmcProtocol,
		Policies:        b.edges.policies,
	}

	return nil
}
