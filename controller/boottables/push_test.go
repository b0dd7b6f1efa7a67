package boottables_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

// snapshotEdge is a BootPlans server that takes snapshots only (deltas are refused, so snapshots follow).
type snapshotEdge struct {
	bootpb.UnimplementedBootPlansServer

	mu  sync.Mutex
	tbl *bootpb.Table
}

func (e *snapshotEdge) State(context.Context, *bootpb.StateRequest) (*bootpb.StateResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return &bootpb.StateResponse{Version: e.tbl.GetVersion()}, nil
}

func (e *snapshotEdge) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	if req.GetSnapshot() == nil {
		return nil, status.Error(codes.FailedPrecondition, "snapshots only")
	}

	e.mu.Lock()
	defer e.mu.Unlock()

	e.tbl = proto.Clone(req.GetSnapshot()).(*bootpb.Table)

	return &bootpb.ApplyResponse{Version: e.tbl.GetVersion()}, nil
}

func (e *snapshotEdge) table() *bootpb.Table {
	e.mu.Lock()
	defer e.mu.Unlock()

	return proto.Clone(e.tbl).(*bootpb.Table)
}

// connectEdge serves a snapshotEdge on loopback and keeps site's session running.
func connectEdge(t *testing.T, plans *boottables.Tables, site string) *snapshotEdge {
	t.Helper()

	edge := &snapshotEdge{}
	srv := grpc.NewServer()
	bootpb.RegisterBootPlansServer(srv, edge)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	go srv.Serve(ln) //nolint:errcheck

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- plans.OnSession(ctx, site, conn) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		conn.Close() //nolint:errcheck
		srv.Stop()
	})

	return edge
}

func TestPush(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	plans := boottables.New(zaptest.NewLogger(t), nil)
	siteA := connectEdge(t, plans, "site-a")
	siteB := connectEdge(t, plans, "site-b")
	push := plans

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	push.SetConfig([]byte("kind: SideroLinkConfig\n"))

	v, err := push.Push(ctx, "site-a", bootplans.Plan{MachineID: id, Mode: bootplans.ModeAgent, Arch: "amd64",
		KernelURL: "http://f/agent/kernel", InitrdURL: "http://f/agent/initrd", KernelArgs: []string{"talos.platform=metal", "foo=1"}})
	require.NoError(t, err)

	tbl := siteA.table()
	require.Equal(t, v, tbl.GetVersion(), "Push returns once the edge holds the version")
	require.Equal(t, "kind: SideroLinkConfig\n", string(tbl.GetConfig()))
	require.Len(t, tbl.GetPlans(), 1)
	require.Equal(t, bootpb.Mode_MODE_AGENT, tbl.GetPlans()[0].GetMode())
	require.Equal(t, []string{"talos.platform=metal", "foo=1"}, tbl.GetPlans()[0].GetExtraArgs())
	require.Equal(t, "http://f/agent/kernel", tbl.GetAgent()["x86_64"].GetKernelUrl())

	_, err = push.Push(ctx, "site-a", bootplans.Plan{MachineID: id, Mode: bootplans.ModeInstall,
		KernelURL: "http://f/k", InitrdURL: "http://f/i", KernelArgs: []string{"console=ttyS0"}})
	require.NoError(t, err)

	p := siteA.table().GetPlans()[0]
	require.Equal(t, bootpb.Mode_MODE_INSTALL, p.GetMode())
	require.Equal(t, "http://f/k", p.GetInstall().GetKernelUrl())

	// the machine shows up at site-b: it leaves site-a's table
	_, err = push.Push(ctx, "site-b", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDisk, DiskMethod: bootplans.DiskIPXESanboot})
	require.NoError(t, err)
	require.Equal(t, bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT, siteB.table().GetPlans()[0].GetDiskMethod())
	require.Eventually(t, func() bool { return len(siteA.table().GetPlans()) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{id}, siteA.table().GetRemoved(), "the snapshot names it removed, so the edge drops it")

	// back at site-a: no longer named removed there, named removed at site-b
	_, err = push.Push(ctx, "site-a", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDeny})
	require.NoError(t, err)
	require.Empty(t, siteA.table().GetRemoved())
	require.Eventually(t, func() bool { return len(siteB.table().GetRemoved()) == 1 }, 10*time.Second, 10*time.Millisecond)

	// no session: Push waits, bounded by its context
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()

	_, err = push.Push(short, "site-c", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDeny})
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = bootplans.ToProto(bootplans.Plan{MachineID: id, Mode: bootplans.ModeInstall, ScriptURL: "http://f/pxe"})
	require.Error(t, err, "script-only install assets cannot go into a boot table")
}

func TestNewSiteCarriesJoinConfig(t *testing.T) {
	t.Parallel()

	plans := boottables.New(zaptest.NewLogger(t), nil)
	edge := connectEdge(t, plans, "new-site")
	push := plans

	push.SetConfig([]byte("kind: SideroLinkConfig\n")) // the session gave the site a table already

	require.Eventually(t, func() bool { return string(edge.table().GetConfig()) == "kind: SideroLinkConfig\n" },
		10*time.Second, 10*time.Millisecond, "a site with no machines yet must still serve the join config")
	require.Empty(t, edge.table().GetPlans())

	// A later config change reaches the site too.
	push.SetConfig([]byte("kind: SideroLinkConfig\napiUrl: new\n"))
	require.Eventually(t, func() bool { return string(edge.table().GetConfig()) == "kind: SideroLinkConfig\napiUrl: new\n" },
		10*time.Second, 10*time.Millisecond)
}

// What an operator set for a site reaches its edge's table (discovery, registered MACs, the site's documents
// after the join config) and only that site's; a later join config keeps the site's documents after it.
func TestSiteSettings(t *testing.T) {
	t.Parallel()

	plans := boottables.New(zaptest.NewLogger(t), nil)
	siteA := connectEdge(t, plans, "site-a")
	siteB := connectEdge(t, plans, "site-b")
	push := plans

	push.SetSite("site-a", boottables.SiteTable{
		Discovery: bootpb.Discovery_DISCOVERY_KNOWN, RegisteredMACs: []string{"52:54:00:00:00:01"}, ExtraConfig: []byte("kind: ResolverConfig\n"),
	})

	tableOf := func(e *snapshotEdge, want func(*bootpb.Table) bool) *bootpb.Table {
		var tbl *bootpb.Table

		require.Eventually(t, func() bool { tbl = e.table(); return want(tbl) }, 10*time.Second, 10*time.Millisecond, "edge holds %v", tbl)

		return tbl
	}

	tbl := tableOf(siteA, func(tb *bootpb.Table) bool { return tb.GetDiscovery() == bootpb.Discovery_DISCOVERY_KNOWN })
	require.Equal(t, []string{"52:54:00:00:00:01"}, tbl.GetRegisteredMacs())
	require.Empty(t, tbl.GetConfig(), "no join config yet: the site's documents wait for it")

	push.SetConfig([]byte("kind: SideroLinkConfig\n"))

	tbl = tableOf(siteA, func(tb *bootpb.Table) bool { return len(tb.GetConfig()) > 0 })
	require.Equal(t, "kind: SideroLinkConfig\n---\nkind: ResolverConfig\n", string(tbl.GetConfig()))

	b := tableOf(siteB, func(tb *bootpb.Table) bool { return len(tb.GetConfig()) > 0 })
	require.Equal(t, "kind: SideroLinkConfig\n", string(b.GetConfig()), "another site gets the join config alone")
	require.Equal(t, bootpb.Discovery_DISCOVERY_UNSPECIFIED, b.GetDiscovery())
	require.Empty(t, b.GetRegisteredMacs())

	push.SetSite("site-a", boottables.SiteTable{})

	tbl = tableOf(siteA, func(tb *bootpb.Table) bool { return tb.GetDiscovery() == bootpb.Discovery_DISCOVERY_UNSPECIFIED })
	require.Empty(t, tbl.GetRegisteredMacs())
	require.Equal(t, "kind: SideroLinkConfig\n", string(tbl.GetConfig()))
}
