package boottables_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// connectEdge serves a snapshots-only fake edge on loopback and keeps site's session running.
func connectEdge(t *testing.T, plans *boottables.Tables, site string) *fakeEdge {
	t.Helper()

	edge := &fakeEdge{snapshotsOnly: true}
	conn := dialFake(t, edge)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- plans.OnSession(ctx, site, conn) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
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

	tbl := siteA.current()
	require.Equal(t, v, tbl.GetVersion(), "Push returns once the edge holds the version")
	require.Equal(t, "kind: SideroLinkConfig\n", string(tbl.GetConfig()))
	require.Len(t, tbl.GetPlans(), 1)
	require.Equal(t, bootpb.Mode_MODE_AGENT, tbl.GetPlans()[0].GetMode())
	require.Equal(t, []string{"talos.platform=metal", "foo=1"}, tbl.GetPlans()[0].GetExtraArgs())
	require.Equal(t, "http://f/agent/kernel", tbl.GetAgent()["x86_64"].GetKernelUrl())

	_, err = push.Push(ctx, "site-a", bootplans.Plan{MachineID: id, Mode: bootplans.ModeInstall,
		KernelURL: "http://f/k", InitrdURL: "http://f/i", KernelArgs: []string{"console=ttyS0"}})
	require.NoError(t, err)

	p := siteA.current().GetPlans()[0]
	require.Equal(t, bootpb.Mode_MODE_INSTALL, p.GetMode())
	require.Equal(t, "http://f/k", p.GetInstall().GetKernelUrl())

	// the machine shows up at site-b: it leaves site-a's table
	_, err = push.Push(ctx, "site-b", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDisk, DiskMethod: bootplans.DiskIPXESanboot})
	require.NoError(t, err)
	require.Equal(t, bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT, siteB.current().GetPlans()[0].GetDiskMethod())
	require.Eventually(t, func() bool { return len(siteA.current().GetPlans()) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{id}, siteA.current().GetRemoved(), "the snapshot names it removed, so the edge drops it")

	// back at site-a: no longer named removed there, named removed at site-b
	_, err = push.Push(ctx, "site-a", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDeny})
	require.NoError(t, err)
	require.Empty(t, siteA.current().GetRemoved())
	require.Eventually(t, func() bool { return len(siteB.current().GetRemoved()) == 1 }, 10*time.Second, 10*time.Millisecond)

	// no session: Push waits, bounded by its context
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()

	_, err = push.Push(short, "site-c", bootplans.Plan{MachineID: id, Mode: bootplans.ModeDeny})
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = bootplans.ToProto(bootplans.Plan{MachineID: id, Mode: bootplans.ModeInstall, UpstreamKernelURL: "http://f/k"})
	require.Error(t, err, "an install plan without an edge-local or absolute kernel cannot go into a boot table")
}

func TestNewSiteCarriesJoinConfig(t *testing.T) {
	t.Parallel()

	plans := boottables.New(zaptest.NewLogger(t), nil)
	edge := connectEdge(t, plans, "new-site")
	push := plans

	push.SetConfig([]byte("kind: SideroLinkConfig\n")) // the session gave the site a table already

	require.Eventually(t, func() bool { return string(edge.current().GetConfig()) == "kind: SideroLinkConfig\n" },
		10*time.Second, 10*time.Millisecond, "a site with no machines yet must still serve the join config")
	require.Empty(t, edge.current().GetPlans())

	// A later config change reaches the site too.
	push.SetConfig([]byte("kind: SideroLinkConfig\napiUrl: new\n"))
	require.Eventually(t, func() bool { return string(edge.current().GetConfig()) == "kind: SideroLinkConfig\napiUrl: new\n" },
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
		DHCP: &bootpb.DHCP{Mode: bootpb.DHCPMode_DHCP_MODE_OFF}, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON,
	})

	tableOf := func(e *fakeEdge, want func(*bootpb.Table) bool) *bootpb.Table {
		var tbl *bootpb.Table

		require.Eventually(t, func() bool { tbl = e.current(); return want(tbl) }, 10*time.Second, 10*time.Millisecond, "edge holds %v", tbl)

		return tbl
	}

	tbl := tableOf(siteA, func(tb *bootpb.Table) bool { return tb.GetDiscovery() == bootpb.Discovery_DISCOVERY_KNOWN })
	require.Equal(t, []string{"52:54:00:00:00:01"}, tbl.GetRegisteredMacs())
	require.Equal(t, bootpb.DHCPMode_DHCP_MODE_OFF, tbl.GetDhcp().GetMode())
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_ON, tbl.GetSecureBoot())
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
	require.Nil(t, tbl.GetDhcp())
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, tbl.GetSecureBoot(), "handed back by a delta")
	require.Equal(t, "kind: SideroLinkConfig\n", string(tbl.GetConfig()))
}
