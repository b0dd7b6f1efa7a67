package bootplans_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/bootplans"
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

	r := bootplans.NewReceiver(zaptest.NewLogger(t), bootplans.HandlerFunc(func(_ context.Context, site string, e *bootpb.Event) error {
		mu.Lock()
		defer mu.Unlock()

		if e.GetSequence() == failOn {
			return errors.New("store unavailable")
		}

		require.Equal(t, "site-a", site)
		handled = append(handled, e.GetSequence())

		return nil
	}), siteFromCtx)

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

// fakeEdge is a BootPlans server with the edge's semantics, recording what it was sent.
type fakeEdge struct {
	bootpb.UnimplementedBootPlansServer

	mu      sync.Mutex
	table   *bootpb.Table
	applied []string
}

func (f *fakeEdge) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if s := req.GetSnapshot(); s != nil {
		f.table = s
		f.applied = append(f.applied, "snapshot")

		return &bootpb.ApplyResponse{Version: s.GetVersion()}, nil
	}

	d := req.GetDelta()
	if f.table == nil || d.GetBaseVersion() != f.table.GetVersion() {
		return nil, status.Error(codes.FailedPrecondition, "base version")
	}

	next := proto.Clone(f.table).(*bootpb.Table)
	next.Version = d.GetVersion()

	keep := next.GetPlans()[:0]
	drop := map[string]bool{}

	for _, u := range d.GetRemove() {
		drop[u] = true
	}

	for _, p := range d.GetUpsert() {
		drop[p.GetUuid()] = true
	}

	for _, p := range next.GetPlans() {
		if !drop[p.GetUuid()] {
			keep = append(keep, p)
		}
	}

	next.Plans = append(keep, d.GetUpsert()...)
	f.table = next
	f.applied = append(f.applied, "delta")

	return &bootpb.ApplyResponse{Version: d.GetVersion()}, nil
}

func (f *fakeEdge) snapshot() (*bootpb.Table, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.table, append([]string(nil), f.applied...)
}

func dialFake(t *testing.T, edge *fakeEdge) *grpc.ClientConn {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	srv := grpc.NewServer()
	bootpb.RegisterBootPlansServer(srv, edge)

	go srv.Serve(ln) //nolint:errcheck

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		srv.Stop()
	})

	return conn
}

func TestPlansSnapshotThenDeltas(t *testing.T) {
	t.Parallel()

	edge := &fakeEdge{}
	conn := dialFake(t, edge)

	plans := bootplans.NewPlans(zaptest.NewLogger(t), nil)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(plans))

	v1 := plans.Set("site-a", &bootpb.Table{Plans: []*bootpb.Plan{{Uuid: "u1"}, {Uuid: "u2", Mode: bootpb.Mode_MODE_DISK}}})
	require.Equal(t, 1.0, gathered(t, reg, "outpost_boot_plans_sites_unacknowledged"), "set, no edge yet")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- plans.OnSession(ctx, "site-a", conn) }()

	waitCtx, waitCancel := context.WithTimeout(ctx, 5*time.Second)
	defer waitCancel()

	require.NoError(t, plans.WaitAcked(waitCtx, "site-a", v1))

	v2 := plans.Set("site-a", &bootpb.Table{Plans: []*bootpb.Plan{{Uuid: "u1", Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{KernelUrl: "k"}}}})
	require.Greater(t, v2, v1)
	require.NoError(t, plans.WaitAcked(waitCtx, "site-a", v2))

	require.Zero(t, gathered(t, reg, "outpost_boot_plans_sites_unacknowledged"), "acknowledged")
	require.Equal(t, 2.0, gathered(t, reg, "outpost_boot_plans_ack_lag_seconds"), "one lag per acknowledged table")

	cancel()
	require.NoError(t, <-done)

	tbl, applied := edge.snapshot()
	require.Equal(t, []string{"snapshot", "delta"}, applied)
	require.Equal(t, v2, tbl.GetVersion())
	require.Len(t, tbl.GetPlans(), 1)
	require.Equal(t, bootpb.Mode_MODE_INSTALL, tbl.GetPlans()[0].GetMode())

	// A new session starts with a snapshot again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- plans.OnSession(ctx2, "site-a", conn) }()

	require.Eventually(t, func() bool { _, a := edge.snapshot(); return len(a) == 3 }, 5*time.Second, 5*time.Millisecond)
	cancel2()
	require.NoError(t, <-done)

	_, applied = edge.snapshot()
	require.Equal(t, "snapshot", applied[2])
}

// gathered is the value of reg's metric name: a gauge's value, or how many observations a histogram holds.
func gathered(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()

	families, err := reg.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}

			return m.GetGauge().GetValue()
		}
	}

	t.Fatalf("no metric %s", name)

	return 0
}

func TestPushAndDiff(t *testing.T) {
	t.Parallel()

	edge := &fakeEdge{}
	v, err := bootplans.Push(context.Background(), dialFake(t, edge), &bootpb.Table{Version: 7})
	require.NoError(t, err)
	require.EqualValues(t, 7, v)

	from := &bootpb.Table{Version: 1, Plans: []*bootpb.Plan{{Uuid: "a"}, {Uuid: "b"}}, KernelArgs: []string{"console=ttyS0"}}
	to := &bootpb.Table{Version: 2, Plans: []*bootpb.Plan{{Uuid: "a"}, {Uuid: "c"}}, KernelArgs: []string{"console=ttyS0"}, Config: []byte("x")}
	d := bootplans.Diff(from, to)
	require.EqualValues(t, 1, d.GetBaseVersion())
	require.EqualValues(t, 2, d.GetVersion())
	require.Len(t, d.GetUpsert(), 1)
	require.Equal(t, "c", d.GetUpsert()[0].GetUuid())
	require.Equal(t, []string{"b"}, d.GetRemove())
	require.False(t, d.GetReplaceKernelArgs())
	require.True(t, d.GetReplaceConfig())
	require.False(t, d.GetReplaceDiscovery())
	require.False(t, d.GetReplaceRegisteredMacs())

	to.Discovery, to.RegisteredMacs = bootpb.Discovery_DISCOVERY_OFF, []string{"52:54:00:00:00:01"}
	d = bootplans.Diff(from, to)
	require.True(t, d.GetReplaceDiscovery())
	require.Equal(t, bootpb.Discovery_DISCOVERY_OFF, d.GetDiscovery())
	require.True(t, d.GetReplaceRegisteredMacs())
	require.Equal(t, []string{"52:54:00:00:00:01"}, d.GetRegisteredMacs())
}

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
	r := bootplans.NewReceiver(zaptest.NewLogger(t), bootplans.HandlerFunc(func(context.Context, string, *bootpb.Event) error { return nil }),
		siteFromCtx).WithInventory(rec)

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
