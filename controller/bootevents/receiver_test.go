package bootevents_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/bootevents"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type siteKey struct{}

func siteFromCtx(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(siteKey{}).(string)

	return s, ok
}

func events(seqs ...uint64) []*bootpb.Event {
	out := make([]*bootpb.Event, 0, len(seqs))
	for _, s := range seqs {
		out = append(out, &bootpb.Event{Sequence: s, Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{Mac: "52:54:00:00:00:01"}}})
	}

	return out
}

func TestReceiverOnceInOrder(t *testing.T) {
	t.Parallel()

	var (
		mu      sync.Mutex
		handled []uint64
		failOn  uint64 = 5
	)

	r := bootevents.NewReceiver(zaptest.NewLogger(t), siteFromCtx, bootevents.HandlerFunc(func(_ context.Context, site string, e *bootpb.Event) error {
		mu.Lock()
		defer mu.Unlock()

		if e.GetSequence() == failOn {
			return errors.New("store unavailable")
		}

		require.Equal(t, "site-a", site)
		handled = append(handled, e.GetSequence())

		return nil
	}))

	ctx := context.WithValue(context.Background(), siteKey{}, "site-a")

	for _, tc := range []struct {
		name  string
		seqs  []uint64
		acked uint64
	}{
		{name: "first batch", seqs: []uint64{1, 2, 3}, acked: 3},
		{name: "resend overlaps: duplicates skipped", seqs: []uint64{2, 3, 4}, acked: 4},
		{name: "handler failure acknowledges what was handled", seqs: []uint64{5, 6}, acked: 4},
		{name: "retry after the failure", seqs: []uint64{5, 6}, acked: 6},
		{name: "empty batch", acked: 6},
	} {
		if tc.name == "retry after the failure" {
			mu.Lock()
			failOn = 0
			mu.Unlock()
		}

		resp, err := r.Publish(ctx, &bootpb.PublishRequest{JournalId: "j1", Events: events(tc.seqs...)})
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.acked, resp.GetAcked(), tc.name)
	}

	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, handled)

	// A new journal (the edge lost its state) starts over.
	resp, err := r.Publish(ctx, &bootpb.PublishRequest{JournalId: "j2", Events: events(1)})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.GetAcked())

	_, err = r.Publish(context.Background(), &bootpb.PublishRequest{JournalId: "j1"})
	require.Equal(t, codes.Unauthenticated, status.Code(err))

	_, err = r.Publish(ctx, &bootpb.PublishRequest{JournalId: "j1", Events: events(9, 8)})
	require.Equal(t, codes.InvalidArgument, status.Code(err))

	_, err = r.Publish(ctx, &bootpb.PublishRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// Every handler given at construction takes every event, in their order, even after one of them failed; the
// failed event is not acknowledged, and its resend reaches them all again.
func TestReceiverFansOut(t *testing.T) {
	t.Parallel()

	var (
		seen []string
		fail = true
	)

	record := func(name string, failing bool) bootevents.HandlerFunc {
		return func(_ context.Context, _ string, e *bootpb.Event) error {
			seen = append(seen, fmt.Sprintf("%s:%d", name, e.GetSequence()))

			if failing && fail && e.GetSequence() == 2 {
				return errors.New("store unavailable")
			}

			return nil
		}
	}

	r := bootevents.NewReceiver(zaptest.NewLogger(t), siteFromCtx, record("locations", false), record("timelines", true))
	ctx := context.WithValue(context.Background(), siteKey{}, "site-a")

	resp, err := r.Publish(ctx, &bootpb.PublishRequest{JournalId: "j1", Events: events(1, 2)})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.GetAcked())
	require.Equal(t, []string{"locations:1", "timelines:1", "locations:2", "timelines:2"}, seen)

	fail, seen = false, nil

	resp, err = r.Publish(ctx, &bootpb.PublishRequest{JournalId: "j1", Events: events(2)})
	require.NoError(t, err)
	require.EqualValues(t, 2, resp.GetAcked())
	require.Equal(t, []string{"locations:2", "timelines:2"}, seen)
}

// fakeEdge is a BootPlans server with the edge's semantics, recording what it was sent.
type inventoryRecorder struct {
	site           string
	tunnels, table []string
}

func (r *inventoryRecorder) Inventory(site string, tunnels, table []string) int {
	r.site, r.tunnels, r.table = site, tunnels, table

	return len(tunnels) - 1
}

func TestReceiverInventory(t *testing.T) {
	t.Parallel()

	rec := &inventoryRecorder{}
	r := bootevents.NewReceiver(zaptest.NewLogger(t), siteFromCtx).WithInventory(rec)

	_, err := r.Inventory(t.Context(), &bootpb.InventoryRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no site identity")

	ctx := context.WithValue(t.Context(), siteKey{}, "site-a")

	resp, err := r.Inventory(ctx, &bootpb.InventoryRequest{Tunnels: []string{"a", "b"}, Table: []string{"c"}})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.GetRefused())
	require.Equal(t, inventoryRecorder{site: "site-a", tunnels: []string{"a", "b"}, table: []string{"c"}}, *rec)

	_, err = r.Inventory(ctx, &bootpb.InventoryRequest{Tunnels: make([]string, 1<<16+1)})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "bounded")
}
