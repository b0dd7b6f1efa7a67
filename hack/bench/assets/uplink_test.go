package assetsbench_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	ctlassets "github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/assetcache"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/metal"
)

// TestRelayOverUplinkResumesAfterCut fills an offline site's cache by relay over the real uplink (TLS, yamux,
// gRPC both ways), cuts the WAN link mid-asset, and checks that the download resumes on the next session
// and that the controller's catalog shows the asset cached and the bytes relayed.
func TestRelayOverUplinkResumesAfterCut(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the uplink; skipped under -short")
	}

	const size = 64 << 20

	ctlDir := t.TempDir()
	digest := writeRandomFile(t, ctlDir, size)
	ref := &assetsapi.AssetRef{Name: assetcache.AgentName(metal.AMD64, "initramfs.xz"), Sha256: digest, Size: size}

	catalog := ctlassets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil)
	catalog.SetNeeded("site-a", []*assetsapi.AssetRef{ref})

	rec := &offsetRecorder{}
	relay, err := ctlassets.NewRelay(ctlassets.DefaultRelay(), ctlassets.DirFiles{Dir: ctlDir}, catalog, sites.SiteFromContext, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctl := linklab.StartController(t, linklab.ControllerOptions{
		Register:      []func(grpc.ServiceRegistrar){relay.Register},
		OnSession:     []sites.SessionFunc{catalog.OnSession},
		ServerOptions: []grpc.ServerOption{grpc.StreamInterceptor(rec.intercept)},
	})
	token := ctl.CreateSite(t, "site-a", sites.TokenOptions{})
	wan := linklab.StartProxy(t, ctl.Addr)

	cfg := assetcache.Default()
	cfg.Dir = t.TempDir()
	cfg.RetryBackoff = 20 * time.Millisecond

	store, err := assetcache.New(cfg, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	fcfg := assetcache.DefaultFetcher()
	fcfg.Policy = assetcache.PolicyOffline

	fetcher, err := assetcache.NewFetcher(fcfg, store, nil, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- fetcher.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	linklab.StartEdge(t, wan.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{
		Register:  []func(grpc.ServiceRegistrar){assetcache.NewService(fetcher).Register},
		OnSession: []edgeuplink.SessionFunc{fetcher.OnSession},
	}})

	// the catalog pushes the site's policy and needed assets when the session starts; the edge relays them
	ctl.WaitConnected(t, "site-a")

	// cut the WAN link once the relay is under way
	require.Eventually(t, func() bool { return partialBytes(cfg.Dir) > 8<<20 }, 20*time.Second, time.Millisecond)
	wan.Cut()

	require.Eventually(t, func() bool { return store.Has(digest) }, 60*time.Second, 10*time.Millisecond, "asset never arrived")
	require.NoError(t, store.Check(digest, true))

	rec.mu.Lock()
	offsets := append([]int64(nil), rec.offsets...)
	rec.mu.Unlock()

	require.GreaterOrEqual(t, len(offsets), 2, "the cut did not interrupt the relay")
	require.Positive(t, offsets[len(offsets)-1], "resumed from the start instead of the offset reached")

	require.Eventually(t, func() bool {
		st := catalog.Site("site-a")

		return len(st.Cached) == 1 && len(st.Missing) == 0
	}, 20*time.Second, 10*time.Millisecond, "the catalog never saw the asset cached")

	st := catalog.Site("site-a")
	require.GreaterOrEqual(t, st.BytesRelayed, int64(size)/2)
	t.Logf("relay offsets over the uplink: %v; bytes relayed %d for %d", offsets, st.BytesRelayed, size)
}

// partialBytes is the size of the partial download in the cache's temporary directory.
func partialBytes(cache string) int64 {
	items, _ := os.ReadDir(filepath.Join(cache, "tmp"))

	var n int64

	for _, it := range items {
		if fi, err := it.Info(); err == nil {
			n += fi.Size()
		}
	}

	return n
}
