package boottables_test

import (
	"context"
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
	"github.com/outpost-metal/outpost/controller/boottables"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeEdge is a BootPlans server holding one table. With snapshotsOnly it refuses deltas, so the controller
// sends snapshots (which show what a table names removed).
type fakeEdge struct {
	bootpb.UnimplementedBootPlansServer

	snapshotsOnly bool
	// reach is what the edge says of how its machines reach it, in every acknowledgement.
	reach *bootpb.Reach

	mu      sync.Mutex
	table   *bootpb.Table
	applied []string
}

func (f *fakeEdge) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if f.snapshotsOnly && req.GetSnapshot() == nil {
		return nil, status.Error(codes.FailedPrecondition, "snapshots only")
	}

	if s := req.GetSnapshot(); s != nil {
		f.table = s
		f.applied = append(f.applied, "snapshot")

		return &bootpb.ApplyResponse{Version: s.GetVersion(), Reach: f.reach}, nil
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

	return &bootpb.ApplyResponse{Version: d.GetVersion(), Reach: f.reach}, nil
}

// current is a copy of the table the edge holds.
func (f *fakeEdge) current() *bootpb.Table {
	f.mu.Lock()
	defer f.mu.Unlock()

	return proto.Clone(f.table).(*bootpb.Table)
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

func TestSnapshotThenDeltas(t *testing.T) {
	t.Parallel()

	reach := &bootpb.Reach{HttpBase: "http://10.0.0.2:8080", AgentAddress: "10.0.0.2:50000"}
	edge := &fakeEdge{reach: reach}
	conn := dialFake(t, edge)

	tables := boottables.New(zaptest.NewLogger(t), nil)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(tables))

	tables.SetSite("site-a", boottables.SiteTable{Discovery: bootpb.Discovery_DISCOVERY_KNOWN})
	require.Nil(t, tables.Reach("site-a"), "no edge has said yet")
	require.Equal(t, 1.0, gathered(t, reg, "outpost_boot_plans_sites_unacknowledged"), "a table, no edge yet")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- tables.OnSession(ctx, "site-a", conn) }()

	waitCtx, waitCancel := context.WithTimeout(ctx, 5*time.Second)
	defer waitCancel()

	const u1, u2 = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"

	v1, err := tables.Push(waitCtx, "site-a", bootplans.Plan{MachineID: u1, Mode: bootplans.ModeAgent})
	require.NoError(t, err)

	_, err = tables.Push(waitCtx, "site-a", bootplans.Plan{MachineID: u2, Mode: bootplans.ModeDisk})
	require.NoError(t, err)

	install := bootplans.Plan{MachineID: u1, Mode: bootplans.ModeInstall, KernelURL: "k"}
	require.False(t, tables.Holds("site-a", install))

	v2, err := tables.Push(waitCtx, "site-a", install)
	require.NoError(t, err)
	require.Greater(t, v2, v1)
	require.True(t, tables.Holds("site-a", install), "acknowledged")
	require.False(t, tables.Holds("site-b", install), "another site")
	require.True(t, proto.Equal(reach, tables.Reach("site-a")), "the edge's acknowledgement said how its machines reach it: %v", tables.Reach("site-a"))
	require.Nil(t, tables.Reach("site-b"))

	again, err := tables.Push(waitCtx, "site-a", install)
	require.NoError(t, err)
	require.Equal(t, v2, again, "a plan the edge holds is not sent again")

	require.Zero(t, gathered(t, reg, "outpost_boot_plans_sites_unacknowledged"), "acknowledged")

	cancel()
	require.NoError(t, <-done)

	tbl, applied := edge.snapshot()
	require.Equal(t, "snapshot", applied[0])

	for _, a := range applied[1:] {
		require.Equal(t, "delta", a)
	}

	require.Equal(t, float64(len(applied)), gathered(t, reg, "outpost_boot_plans_ack_lag_seconds"), "one lag per acknowledged table")
	require.Equal(t, v2, tbl.GetVersion())
	require.Equal(t, bootpb.Discovery_DISCOVERY_KNOWN, tbl.GetDiscovery())
	modes := map[string]bootpb.Mode{}
	for _, p := range tbl.GetPlans() {
		modes[p.GetUuid()] = p.GetMode()
	}

	require.Equal(t, map[string]bootpb.Mode{u1: bootpb.Mode_MODE_INSTALL, u2: bootpb.Mode_MODE_DISK}, modes)

	// A new session starts with a snapshot again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- tables.OnSession(ctx2, "site-a", conn) }()

	require.Eventually(t, func() bool { _, a := edge.snapshot(); return len(a) == len(applied)+1 }, 5*time.Second, 5*time.Millisecond)
	cancel2()
	require.NoError(t, <-done)

	_, after := edge.snapshot()
	require.Equal(t, "snapshot", after[len(applied)])
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
	v, err := boottables.PushSnapshot(context.Background(), dialFake(t, edge), &bootpb.Table{Version: 7})
	require.NoError(t, err)
	require.EqualValues(t, 7, v)

	from := &bootpb.Table{Version: 1, Plans: []*bootpb.Plan{{Uuid: "a"}, {Uuid: "b"}}, KernelArgs: []string{"console=ttyS0"}}
	to := &bootpb.Table{Version: 2, Plans: []*bootpb.Plan{{Uuid: "a"}, {Uuid: "c"}}, KernelArgs: []string{"console=ttyS0"}, Config: []byte("x")}
	d := boottables.Diff(from, to)
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
	d = boottables.Diff(from, to)
	require.True(t, d.GetReplaceDiscovery())
	require.Equal(t, bootpb.Discovery_DISCOVERY_OFF, d.GetDiscovery())
	require.True(t, d.GetReplaceRegisteredMacs())
	require.Equal(t, []string{"52:54:00:00:00:01"}, d.GetRegisteredMacs())
	require.False(t, d.GetReplaceDhcp())

	from.Dhcp = &bootpb.DHCP{Mode: bootpb.DHCPMode_DHCP_MODE_OFF}
	d = boottables.Diff(from, to)
	require.True(t, d.GetReplaceDhcp(), "a service set back to the edge's own is replaced by nothing")
	require.Nil(t, d.GetDhcp())

	to.Dhcp = &bootpb.DHCP{Mode: bootpb.DHCPMode_DHCP_MODE_OFF}
	require.False(t, boottables.Diff(from, to).GetReplaceDhcp())
}
