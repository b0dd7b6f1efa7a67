package app

import (
	"context"
	"errors"
	"net"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/uplink"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// controllerSession runs for each uplink session: it reports the edge's inventory, then delivers the
// journal's events in order until the session ends.
func controllerSession(jrnl *journal.Journal, tunnels *tunnel.Server, table *boot.Table, log *zap.Logger) uplink.SessionFunc {
	return func(ctx context.Context, conn grpc.ClientConnInterface) error {
		events := bootpb.NewEventsClient(conn)
		reportInventory(ctx, events, tunnels, table, log)

		return jrnl.Deliver(ctx, events)
	}
}

// reportInventory tells the controller what the edge holds at the start of a session: the open agent tunnels
// and the machines of the boot table, so a restarted controller knows the site at once. A controller that
// does not know the call, or fails it, is logged; the session goes on (events still arrive through the journal).
func reportInventory(ctx context.Context, events bootpb.EventsClient, tunnels *tunnel.Server, table *boot.Table, log *zap.Logger) {
	req := &bootpb.InventoryRequest{Tunnels: tunnels.Open(), Table: table.UUIDs(), TableVersion: table.Version()}

	resp, err := events.Inventory(ctx, req)
	if err != nil {
		log.Warn("inventory not taken by the controller", zap.Error(err))

		return
	}

	log.Info("inventory reported", zap.Int("tunnels", len(req.GetTunnels())), zap.Int("plans", len(req.GetTable())),
		zap.Uint32("refused_by_controller", resp.GetRefused()))
}

// serveControllerAPI serves srv on ln until ctx ends (Options.ControllerAPI: the lab reaches what the
// controller reaches over the uplink).
func serveControllerAPI(ctx context.Context, srv *grpc.Server, ln net.Listener) error {
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}

	return nil
}

// statusCounters are what the edge reports in its Edge.Status RPC.
func statusCounters(jrnl *journal.Journal, table *boot.Table) func() map[string]int64 {
	return func() map[string]int64 {
		c := jrnl.Counters()
		c["boot_table_version"] = int64(table.Version()) // versions stay far below 2^63

		return c
	}
}
