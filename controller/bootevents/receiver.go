// Package bootevents receives the edges' event journals (Receiver, the Events and Inventory services): what
// each site's DHCP, TFTP, HTTP and tunnels saw, handed on once per event and in order.
package bootevents

import (
	"context"
	"errors"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// maxJournalID bounds the journal ID an edge may send.
const maxJournalID = 64

// Handler handles one event of a site. It is called once per (site, journal, sequence), in sequence order.
type Handler interface {
	HandleEvent(ctx context.Context, site string, e *bootpb.Event) error
}

// InventoryHandler reconciles what a site's edge holds at the start of a session (machines.Locations);
// it returns how many of the edge's claims it refused.
type InventoryHandler interface {
	Inventory(site string, tunnels, table []string) (refused int)
}

// maxInventory bounds each list of an inventory (an edge serves at most a few thousand machines).
const maxInventory = 1 << 16

// SiteFunc returns the authenticated site of a call (sites.SiteFromContext).
type SiteFunc func(ctx context.Context) (string, bool)

// Receiver serves the Events service: it hands each new event once, in order, to every Handler given at
// construction (the machines' locations, the timelines), and acknowledges by sequence number. Events at or below the acknowledged sequence are duplicates (a resend
// after a lost acknowledgement) and are skipped.
type Receiver struct {
	bootpb.UnimplementedEventsServer

	log       *zap.Logger
	handlers  []Handler
	site      SiteFunc
	inventory InventoryHandler

	mu      sync.Mutex
	streams map[streamKey]*streamState
}

type streamKey struct{ site, journal string }

type streamState struct {
	mu    sync.Mutex
	acked uint64
}

// NewReceiver returns a Receiver that hands each event to handlers, in their order.
func NewReceiver(logger *zap.Logger, site SiteFunc, handlers ...Handler) *Receiver {
	return &Receiver{
		log: logger.With(zap.String("component", "bootplans-events")), handlers: handlers, site: site,
		streams: map[streamKey]*streamState{},
	}
}

// WithInventory makes the receiver hand edges' inventories to h (without it, they are acknowledged and
// dropped).
func (r *Receiver) WithInventory(h InventoryHandler) *Receiver {
	r.inventory = h

	return r
}

// Inventory implements bootpb.EventsServer: the calling site's edge says what it holds now.
func (r *Receiver) Inventory(ctx context.Context, req *bootpb.InventoryRequest) (*bootpb.InventoryResponse, error) {
	site, ok := r.site(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no site identity on this call")
	}

	if len(req.GetTunnels()) > maxInventory || len(req.GetTable()) > maxInventory {
		return nil, status.Errorf(codes.InvalidArgument, "inventory of %d tunnels and %d plans: at most %d each",
			len(req.GetTunnels()), len(req.GetTable()), maxInventory)
	}

	if r.inventory == nil {
		return &bootpb.InventoryResponse{}, nil
	}

	refused := r.inventory.Inventory(site, req.GetTunnels(), req.GetTable())

	r.log.Info("edge inventory", zap.String("site", site), zap.Int("tunnels", len(req.GetTunnels())),
		zap.Int("plans", len(req.GetTable())), zap.Int("refused", refused))

	return &bootpb.InventoryResponse{Refused: uint32(refused)}, nil // bounded by maxInventory
}

// Register registers the Events service (it fits sites.Options.Register).
func (r *Receiver) Register(s grpc.ServiceRegistrar) {
	bootpb.RegisterEventsServer(s, r)
}

// Acked returns the highest sequence handled for a site's journal.
func (r *Receiver) Acked(site, journal string) uint64 {
	st := r.stream(site, journal)

	st.mu.Lock()
	defer st.mu.Unlock()

	return st.acked
}

func (r *Receiver) stream(site, journal string) *streamState {
	r.mu.Lock()
	defer r.mu.Unlock()

	k := streamKey{site, journal}

	st, ok := r.streams[k]
	if !ok {
		st = &streamState{}
		r.streams[k] = st
	}

	return st
}

// handle hands e to every handler, even when one fails; the event is handled when none failed. (A failed
// event is resent: the handlers that took it see it again.)
func (r *Receiver) handle(ctx context.Context, site string, e *bootpb.Event) error {
	var errs []error

	for _, h := range r.handlers {
		if err := h.HandleEvent(ctx, site, e); err != nil {
			errs = append(errs, err)
		}
	}

	return errors.Join(errs...)
}

// Publish handles a batch of events from the calling site's edge.
func (r *Receiver) Publish(ctx context.Context, req *bootpb.PublishRequest) (*bootpb.PublishResponse, error) {
	site, ok := r.site(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no site identity on this call")
	}

	if id := req.GetJournalId(); id == "" || len(id) > maxJournalID {
		return nil, status.Errorf(codes.InvalidArgument, "journal id of %d bytes", len(id))
	}

	for i := 1; i < len(req.GetEvents()); i++ {
		if req.GetEvents()[i].GetSequence() <= req.GetEvents()[i-1].GetSequence() {
			return nil, status.Error(codes.InvalidArgument, "events are not in increasing sequence order")
		}
	}

	st := r.stream(site, req.GetJournalId())

	// One batch at a time per journal: a replaced session may still be sending.
	st.mu.Lock()
	defer st.mu.Unlock()

	for _, e := range req.GetEvents() {
		seq := e.GetSequence()
		if seq <= st.acked {
			continue // duplicate
		}

		if seq > st.acked+1 && st.acked > 0 {
			r.log.Warn("gap in edge events (dropped by the edge's bounded journal)",
				zap.String("site", site), zap.Uint64("after", st.acked), zap.Uint64("next", seq))
		}

		if err := r.handle(ctx, site, e); err != nil {
			// Acknowledge what was handled; the edge resends the rest.
			r.log.Warn("handling edge event failed", zap.String("site", site), zap.Uint64("sequence", seq), zap.Error(err))

			return &bootpb.PublishResponse{Acked: st.acked}, nil
		}

		st.acked = seq
	}

	return &bootpb.PublishResponse{Acked: st.acked}, nil
}
