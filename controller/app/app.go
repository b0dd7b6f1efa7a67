// Package app is the controller's composition root: it builds every component from the configuration,
// wires them together and runs them under one errgroup.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/impl/store"
	"github.com/cosi-project/runtime/pkg/state/impl/store/bolt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/bbolt"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/sites"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
)

// Run runs the controller until ctx is done.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}

	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}

	if err := resources.Register(); err != nil {
		return err
	}

	st, closeStore, err := openState(filepath.Join(cfg.StateDir, "outpost.db"))
	if err != nil {
		return err
	}
	defer closeStore() //nolint:errcheck

	ca, err := sites.LoadOrCreateCA(filepath.Join(cfg.StateDir, "ca"), time.Now())
	if err != nil {
		return fmt.Errorf("enrollment CA: %w", err)
	}

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	registry := sites.NewRegistry(st, ca, rand.Reader, time.Now)

	siteAssets, err := newSiteAssets(ctx, cfg, registry, log)
	if err != nil {
		return err
	}

	catalog, relay := siteAssets.catalog, siteAssets.relay

	// The uplink server is created below; the edge clients reach sites through it.
	var uplinkServer *sites.Server

	edges, err := newEdgeWiring(log, func(siteID string) (grpc.ClientConnInterface, error) { return uplinkServer.Conn(siteID) }, cfg)
	if err != nil {
		return err
	}

	uplinkServer, err = sites.NewServer(sites.Options{
		Logger:       log,
		Registry:     registry,
		CA:           ca,
		Statuses:     st,
		Metrics:      metrics,
		CertValidity: cfg.CertValidity,
		Limits:       cfg.UplinkLimits,
		ServerNames:  cfg.ServerNames,
		Register:     []func(grpc.ServiceRegistrar){relay.Register, edges.receiver.Register},
		OnSession: []sites.SessionFunc{
			catalog.OnSession, edges.plans.OnSession, edges.sessionStarted, siteAssets.sessionStarted, edges.watches.OnSession,
		},
	})
	if err != nil {
		return err
	}

	uplinkLn, err := net.Listen("tcp", cfg.UplinkListen)
	if err != nil {
		return fmt.Errorf("uplink listener: %w", err)
	}

	adminLn, err := listenUnix(cfg.AdminSocketPath())
	if err != nil {
		uplinkLn.Close() //nolint:errcheck

		return err
	}

	adminServer := grpc.NewServer()
	adminpb.RegisterAdminServer(adminServer, sites.NewAdmin(registry, uplinkServer, st, catalogState{catalog}))

	log.Info("controller starting",
		zap.String("uplink", uplinkLn.Addr().String()),
		zap.String("admin_socket", cfg.AdminSocketPath()),
		zap.String("ca_fingerprint", fmt.Sprintf("%x", ca.Fingerprint())),
	)

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return uplinkServer.Serve(ctx, uplinkLn) })
	eg.Go(func() error { return serveGRPC(ctx, adminServer, adminLn) })

	if cfg.OmniEnabled() {
		health := siteHealth(func(ctx context.Context) ([]string, error) {
			list, err := registry.List(ctx)
			if err != nil {
				return nil, err
			}

			ids := make([]string, 0, len(list))
			for _, s := range list {
				ids = append(ids, s.Metadata().ID())
			}

			return ids, nil
		}, uplinkServer.Connected)

		eg.Go(func() error {
			return runLifecycle(ctx, cfg, log, edges, siteAssets, metrics, health, registryLabels{registry})
		})
	} else {
		log.Warn("no Omni endpoint configured: sites and edges are served, machines are not managed (set --omni-endpoint)")
	}

	if cfg.HTTPListen != "" {
		httpLn, err := net.Listen("tcp", cfg.HTTPListen)
		if err != nil {
			return fmt.Errorf("http listener: %w", err)
		}

		eg.Go(func() error { return serveHTTP(ctx, httpLn, metrics) })
	}

	return eg.Wait()
}

// siteAssets is the controller's side of boot assets: per-site policy and state (the catalog), the relay that
// streams files to edges, and what each site must hold (the agent image, plus what its plans name).
type siteAssets struct {
	catalog  *assets.Catalog
	relay    *assets.Relay
	needs    *assets.Needs
	relayDir string
}

// newSiteAssets builds the catalog with each site's stored policy, the relay over the controller's asset
// directory and the needs of every known site.
func newSiteAssets(ctx context.Context, cfg config.Config, registry *sites.Registry, log *zap.Logger) (*siteAssets, error) {
	defaultPolicy, err := assets.ParsePolicy(cfg.DefaultAssetPolicy)
	if err != nil {
		return nil, err
	}

	catalog := assets.NewCatalog(defaultPolicy, time.Now)

	list, err := registry.List(ctx)
	if err != nil {
		return nil, err
	}

	for _, site := range list {
		if p := assetspb.Policy(site.TypedSpec().Value.GetAssetPolicy()); p != assetspb.Policy_POLICY_UNSPECIFIED {
			if err := catalog.SetPolicy(site.Metadata().ID(), p); err != nil {
				return nil, err
			}
		}
	}

	dir := cfg.AssetsDir
	if dir == "" {
		dir = filepath.Join(cfg.StateDir, "assets")
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("asset directory: %w", err)
	}

	relay, err := assets.NewRelay(assets.DefaultRelay(), assets.DirFiles{Dir: dir}, catalog, sites.SiteFromContext, log)
	if err != nil {
		return nil, err
	}

	var agentRefs []*assetspb.AssetRef

	if cfg.AgentAssetsDir != "" {
		if agentRefs, err = loadAgentAssets(cfg.AgentAssetsDir, dir); err != nil {
			return nil, err
		}

		log.Info("agent-mode assets offered to every site", zap.Int("assets", len(agentRefs)))
	}

	needs := assets.NewNeeds(catalog, agentRefs)

	for _, site := range list {
		needs.Site(site.Metadata().ID())
	}

	return &siteAssets{catalog: catalog, relay: relay, needs: needs, relayDir: dir}, nil
}

// sessionStarted asks a connecting site for what it must hold.
func (a *siteAssets) sessionStarted(_ context.Context, siteID string, _ grpc.ClientConnInterface) error {
	a.needs.Site(siteID)

	return nil
}

// catalogState adapts the asset catalog to what the admin API needs.
type catalogState struct{ *assets.Catalog }

func (c catalogState) SiteAssets(siteID string) *assetspb.SiteAssetState {
	return c.Site(siteID).Proto()
}

// openState returns COSI state whose controller namespace is persisted in a bolt file; other
// namespaces (connection state) live in memory.
func openState(path string) (state.State, func() error, error) {
	backing, err := bolt.NewBackingStore(func() (*bbolt.DB, error) {
		return bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	}, store.ProtobufMarshaler{})
	if err != nil {
		return nil, nil, fmt.Errorf("open state %s: %w", path, err)
	}

	st := state.WrapCore(namespaced.NewState(func(ns resource.Namespace) state.CoreState {
		if ns == resources.Namespace {
			return inmem.NewStateWithOptions(inmem.WithBackingStore(backing.WithNamespace(ns)))(ns)
		}

		return inmem.NewState(ns)
	}))

	return st, backing.Close, nil
}

// listenUnix listens on a unix socket only its owner can use, replacing a stale socket file.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale admin socket: %w", err)
	}

	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}

	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close() //nolint:errcheck

		return nil, fmt.Errorf("admin socket permissions: %w", err)
	}

	return ln, nil
}

func serveGRPC(ctx context.Context, srv *grpc.Server, ln net.Listener) error {
	stop := context.AfterFunc(ctx, srv.GracefulStop)
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("admin API: %w", err)
	}

	return nil
}

func serveHTTP(ctx context.Context, ln net.Listener, metrics *prometheus.Registry) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }) //nolint:errcheck

	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}

	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		srv.Shutdown(sctx) //nolint:errcheck
	})
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}

	return nil
}
