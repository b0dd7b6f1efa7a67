package app

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/machines"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// reachingEdge is a site's edge as the controller's boot tables see it: it holds what it is sent and says how
// its machines reach it in every acknowledgement.
type reachingEdge struct {
	bootpb.UnimplementedBootPlansServer

	reach *bootpb.Reach

	mu    sync.Mutex
	table *bootpb.Table
}

func (e *reachingEdge) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	if s := req.GetSnapshot(); s != nil {
		e.table = s
	} else {
		e.table = proto.Clone(e.table).(*bootpb.Table)
		e.table.Version = req.GetDelta().GetVersion()

		if req.GetDelta().GetReplaceSignedAgent() {
			e.table.SignedAgent = req.GetDelta().GetSignedAgent()
		}
	}

	return &bootpb.ApplyResponse{Version: e.table.GetVersion(), Reach: e.reach}, nil
}

func (e *reachingEdge) signedAgent() map[string]*bootpb.SignedImage {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.table.GetSignedAgent()
}

// A site whose operator said its machines enforce Secure Boot gets agent mode as a signed image in its table
// once its edge has said how its machines reach it: the image of the agent profile with the edge's addresses
// baked in, from the controller's source (here a local directory holding it under that profile's schematic),
// named among the site's needs so the site holds it. The setting turned off takes it away again.
func TestSiteSignedAgentImages(t *testing.T) {
	t.Parallel()

	const site = "site-a"

	reach := &bootpb.Reach{HttpBase: "http://10.0.0.2:8080", AgentAddress: "10.0.0.2:50000"}

	// The local source: the agent profile's kernel and initramfs, and its signed image for amd64 only.
	dir := t.TempDir()
	cfg := bootplans.DefaultPlannerConfig()
	agent := assets.Profile{TalosVersion: cfg.AgentTalosVersion, Extensions: cfg.AgentExtensions}.Normalize()
	signedProfile := agent
	signedProfile.SecureBoot = true
	signedProfile.KernelArgs = []string{"talos.platform=metal", "console=" + cfg.Console,
		"talos.config=" + reach.GetHttpBase() + "/config?u=${uuid}", "metal.provider.address=" + reach.GetAgentAddress()}

	place := func(p assets.Profile, files ...string) string {
		id, err := p.Schematic().ID()
		require.NoError(t, err)

		for _, f := range files {
			path := filepath.Join(dir, id, p.TalosVersion, f)
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte("MZ "+f), 0o644))
		}

		return id
	}
	place(agent, "kernel-amd64", "initramfs-amd64.xz", "kernel-arm64", "initramfs-arm64.xz")
	signedID := place(signedProfile, "metal-amd64-secureboot-uki.efi")

	res, err := assets.NewLocalResolver(dir, "/assets/install")
	require.NoError(t, err)

	planner, err := bootplans.NewPlanner(cfg, res)
	require.NoError(t, err)

	log := zaptest.NewLogger(t)
	tables := boottables.New(log, nil)
	policies := machines.NewSitePolicies()
	catalog := assets.NewCatalog(assetspb.Policy_POLICY_CACHE, time.Now)
	needs := assets.NewNeeds(catalog, nil, nil)

	s := newSignedAgents(log, planner, tables, policies, needs, assets.NewInstallFiles(dir, "/assets/install", t.TempDir()))
	tables.OnReach(s.Kick)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 2)

	go func() { done <- s.Run(ctx) }()

	// The site's edge, over gRPC as the uplink carries it.
	edge := &reachingEdge{reach: reach}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	srv := grpc.NewServer()
	bootpb.RegisterBootPlansServer(srv, edge)

	go srv.Serve(ln) //nolint:errcheck

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, <-done)
		conn.Close() //nolint:errcheck
		srv.Stop()
	})

	require.NoError(t, policies.Set(site, machines.SitePolicy{SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON}))
	s.Kick(site) // as applySiteSettings does

	go func() { done <- tables.OnSession(ctx, site, conn) }()

	want := "/assets/install/" + signedID + "/" + agent.TalosVersion + "/metal-amd64-secureboot-uki.efi"

	require.Eventually(t, func() bool {
		got := edge.signedAgent()

		return len(got) == 1 && got["x86_64"].GetUrl() == want
	}, 10*time.Second, 10*time.Millisecond, "the site's table carries the signed agent image for amd64 (none for arm64: no file)")

	var named bool

	for _, ref := range catalog.Needed(site) {
		named = named || strings.HasSuffix(ref.GetName(), signedID+"/"+agent.TalosVersion+"/metal-amd64-secureboot-uki.efi")
	}

	require.True(t, named, "the site must hold it: %v", catalog.Needed(site))

	// Another site's turn (its edge has not said how it is reached: none there) leaves this site's alone.
	require.NoError(t, policies.Set("site-b", machines.SitePolicy{SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON}))
	require.NoError(t, s.refresh(t.Context(), "site-b"))
	require.True(t, slices.ContainsFunc(catalog.Needed(site), func(r *assetspb.AssetRef) bool {
		return strings.HasSuffix(r.GetName(), "metal-amd64-secureboot-uki.efi")
	}), "site-b's images are its own: %v", catalog.Needed(site))
	require.Empty(t, catalog.Needed("site-b"))

	// The operator turns it off: the image goes from the table.
	require.NoError(t, policies.Set(site, machines.SitePolicy{}))
	s.Kick(site)

	require.Eventually(t, func() bool { return len(edge.signedAgent()) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// ackingEdge acknowledges every plan at once, as an edge whose table took it.
type ackingEdge struct{}

func (ackingEdge) Push(context.Context, string, bootplans.Plan) (uint64, error) { return 1, nil }
func (ackingEdge) Holds(string, bootplans.Plan) bool                            { return true }

// A plan that boots a signed image is held only once its site can serve the image (its edge reported it
// cached, or the site fetches upstream): the machine is not rebooted into a DHCP answer that offers nothing.
func TestSignedPlanHeldOnceTheSiteServesIt(t *testing.T) {
	t.Parallel()

	const name = "talos/v1.11.5/abc/amd64/secureboot-uki.efi"

	catalog := assets.NewCatalog(assetspb.Policy_POLICY_CACHE, time.Now)
	p := &assetAwarePusher{next: ackingEdge{}, needs: assets.NewNeeds(catalog, nil, nil), install: &assets.InstallFiles{}, catalog: catalog}

	plan := bootplans.Plan{MachineID: "4c4c4544-0042-3510-8052-b4c04f384833", Mode: bootplans.ModeInstall, SignedURL: "/assets/" + name}
	require.False(t, p.Holds("site-a", plan), "acknowledged, but the edge does not hold the image")

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := p.Push(ctx, "site-a", plan)

	cancel()
	require.ErrorContains(t, err, "does not hold "+plan.SignedURL)

	catalog.RecordReport("site-a", &assetspb.AssetReport{Assets: []*assetspb.AssetStatus{
		{Ref: &assetspb.AssetRef{Name: name}, State: assetspb.AssetState_ASSET_STATE_FETCHING},
	}})
	require.False(t, p.Holds("site-a", plan), "still fetching")

	catalog.RecordReport("site-a", &assetspb.AssetReport{Assets: []*assetspb.AssetStatus{
		{Ref: &assetspb.AssetRef{Name: name}, State: assetspb.AssetState_ASSET_STATE_PRESENT},
	}})
	require.True(t, p.Holds("site-a", plan))

	_, err = p.Push(t.Context(), "site-a", plan)
	require.NoError(t, err)

	require.NoError(t, catalog.SetPolicy("site-b", assetspb.Policy_POLICY_PASSTHROUGH))
	require.True(t, p.Holds("site-b", plan), "a passthrough site's machines fetch it upstream")

	require.True(t, p.Holds("site-a", bootplans.Plan{MachineID: plan.MachineID, Mode: bootplans.ModeInstall, KernelURL: "/assets/k"}),
		"no signed image: as the edge acknowledged")
}
