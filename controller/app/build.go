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

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/lease"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
	"github.com/outpost-metal/outpost/shared/rungroup"
)

// builder holds what Build has constructed so far; each step reads what earlier steps made and adds its
// own. Steps of optional components (see optionalSteps) use the same fields.
type builder struct {
	cfg config.Config
	log *zap.Logger

	// ctrl collects the components to run and the closers, in the order they were built.
	ctrl *Controller

	store    state.State
	ca       *sites.CA
	metrics  *prometheus.Registry
	registry *sites.Registry
	assets   *siteAssets
	edges    *edgeWiring
	uplink   *sites.Server
	admin    *grpc.Server
	// mux is the HTTP server's (/metrics, /healthz); optional components may add their pages to it.
	mux *http.ServeMux
	// lifecycleDeps are handed to the lifecycle when Omni is configured; optional components may fill
	// its optional collaborators (the journal) before the lifecycle step.
	lifecycleDeps lifecycle.Deps
	// timelines take the edges' events (edges.go) and the lifecycle's journal (status.go); every Omni session
	// loads and keeps them.
	timelines *timeline.Book
	// httpAccess wraps the HTTP listener and handler (TLS, token: status.go; nil: served as they are).
	httpAccess func(net.Listener) (net.Listener, http.Handler, error)

	// trustedRoots (PEM) and extraDocs are what the configuration names in files, read before anything is
	// built so that a missing file is reported at once, not after Omni answers.
	trustedRoots string
	extraDocs    omni.ExtraDocuments

	// elector is the lease (with Omni); acting are the components that run only while it is held (see act).
	elector *lease.Elector
	acting  []rungroup.Component
	// shared is the Omni connection the sites, the CA and the lease are kept through (nil without Omni).
	shared *omni.Connection
	// signed keeps the sites' signed agent images (nil without Omni: no plans at all).
	signed *signedAgents
}

// step is one construction step, named for the error it may return.
type step struct {
	name  string
	build func(ctx context.Context) error
}

// Build constructs every component of the controller from cfg, in dependency order, and starts nothing.
// When a step fails it closes whatever earlier steps opened and returns the error, prefixed with the step's
// name; no goroutine of the controller is left running.
func Build(ctx context.Context, cfg config.Config, log *zap.Logger) (*Controller, error) {
	b := &builder{cfg: cfg, log: log, ctrl: &Controller{group: rungroup.New(log)}}

	steps := []step{
		{"configuration", b.configuration},
		{"store", b.openStore},
		{"metrics", b.newMetrics},
		{"enrollment CA", b.loadCA},
		{"lease", b.newLease},
		{"site assets", b.newSiteAssets},
		{"edge wiring", b.newEdgeWiring},
		{"uplink server", b.newUplinkServer},
		{"machine access", b.newMachineAccess},
		{"site settings", b.newSiteSettings},
		{"admin API", b.newAdmin},
		{"http", b.newHTTP},
	}
	steps = append(steps, b.optionalSteps()...)
	steps = append(steps,
		step{"lifecycle", b.newLifecycle},
		step{"listeners", b.listen},
		step{"lease term", func(context.Context) error { b.runActing(); return nil }},
	)

	for _, s := range steps {
		if err := s.build(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("build %s: %w", s.name, err), b.ctrl.Close())
		}
	}

	return b.ctrl, nil
}

// optionalSteps are the components a controller may have besides its core. Each is a step in its own file
// of this package that adds what it builds to the builder: components to run (b.run), closers (b.onClose),
// pages on b.mux, collaborators in b.lifecycleDeps. They run after the core is built and before the
// lifecycle and the listeners. Add one entry per optional component here.
func (b *builder) optionalSteps() []step {
	return []step{{"status", b.newStatus}}
}

// run adds a long-running component to the controller's run list.
func (b *builder) run(name string, fn func(ctx context.Context) error) {
	b.ctrl.group.Go(name, fn)
}

// onClose adds something to close once every component has returned (or when a later step fails).
func (b *builder) onClose(name string, fn func() error) {
	b.ctrl.group.OnClose(name, fn)
}

func (b *builder) configuration(context.Context) error {
	if err := b.cfg.Validate(); err != nil {
		return err
	}

	if b.cfg.TrustedRootsFile != "" {
		pem, err := os.ReadFile(b.cfg.TrustedRootsFile)
		if err != nil {
			return fmt.Errorf("trusted roots: %w", err)
		}

		b.trustedRoots = string(pem)
	}

	if b.cfg.ExtraMachineConfigFile != "" {
		docs, err := omni.LoadExtraDocuments(b.cfg.ExtraMachineConfigFile)
		if err != nil {
			return err
		}

		b.extraDocs = docs
		b.log.Info("extra machine-config documents served with the join config", zap.Strings("documents", docs.Kinds()))
	}

	if err := os.MkdirAll(b.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}

	return resources.Register()
}

func (b *builder) openStore(context.Context) error {
	st, closeStore, err := openState(filepath.Join(b.cfg.StateDir, "outpost.db"))
	if err != nil {
		return err
	}

	b.onClose("store", closeStore)
	b.store = st

	return nil
}

func (b *builder) loadCA(ctx context.Context) error {
	if b.cfg.OmniEnabled() {
		return b.loadSharedState(ctx)
	}

	ca, err := sites.LoadOrCreateCA(filepath.Join(b.cfg.StateDir, "ca"), time.Now())
	if err != nil {
		return err
	}

	b.ca = ca
	b.registry = sites.NewRegistry(b.store, ca, rand.Reader, time.Now)

	return nil
}

func (b *builder) newMetrics(context.Context) error {
	b.metrics = prometheus.NewRegistry()

	return registerAll(b.metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

func (b *builder) newUplinkServer(context.Context) error {
	srv, err := sites.NewServer(sites.Options{
		Logger:       b.log,
		Registry:     b.registry,
		CA:           b.ca,
		Statuses:     b.store,
		Metrics:      b.metrics,
		CertValidity: b.cfg.CertValidity,
		Limits:       b.cfg.UplinkLimits,
		ServerNames:  b.cfg.ServerNames,
		Register:     []func(grpc.ServiceRegistrar){b.assets.relay.Register, b.edges.receiver.Register},
		OnSession: []sites.SessionFunc{
			b.assets.catalog.OnSession, b.edges.tables.OnSession, b.assets.needs.OnSession,
			b.edges.watches.OnSession,
		},
	})
	if err != nil {
		return err
	}

	b.uplink = srv

	return nil
}

func (b *builder) newAdmin(context.Context) error {
	b.admin = grpc.NewServer()
	var opts []sites.AdminOption
	if b.elector != nil {
		opts = append(opts, sites.WithRole(b.elector))
	}

	opts = append(opts, sites.WithSettings(b.checkSiteSettings))

	if b.assets.resolver != nil {
		opts = append(opts, sites.WithStaging(staging{b.assets.resolver}))
	}

	opts = append(opts, sites.WithBundler(bundler{
		assets: b.assets, relayDir: b.cfg.AssetsDirPath(), controller: fmt.Sprintf("%x", b.ca.Fingerprint()),
	}))

	adminpb.RegisterAdminServer(b.admin, sites.NewAdmin(b.registry, b.uplink, b.store, b.assets.needs, opts...))
	adminpb.RegisterSiteMachinesServer(b.admin, machineaccess.NewImageBoots(b.edges.clients.Access, func(id, kind, text string, failed bool) {
		if b.timelines != nil { // built with the edge wiring, before anything is served
			b.timelines.Record(id, kind, text, failed)
		}
	}))
	consoles := machineaccess.NewConsoles(b.edges.clients.Access, b.edges.watches, b.log, time.Now)
	consolepb.RegisterConsoleServer(b.admin, consoles)

	return registerAll(b.metrics, consoles.Collectors()...)
}

func (b *builder) newHTTP(context.Context) error {
	b.mux = newHTTPMux(b.metrics)
	b.mux.Handle("GET /readyz", readyHandler(b.elector))

	return nil
}

// listen opens the listeners last, so that a failure of any other step leaves no port taken, and adds the
// servers on them to the run list.
func (b *builder) listen(context.Context) error {
	if b.elector != nil {
		b.listenUplinkPerTerm()
	} else {
		uplinkLn, err := net.Listen("tcp", b.cfg.UplinkListen)
		if err != nil {
			return fmt.Errorf("uplink: %w", err)
		}

		b.onClose("uplink listener", uplinkLn.Close)
		b.ctrl.uplinkAddr = uplinkLn.Addr()
		b.run("uplink", func(ctx context.Context) error { return b.uplink.Serve(ctx, uplinkLn) })
	}

	adminLn, err := listenUnix(b.cfg.AdminSocketPath())
	if err != nil {
		return err
	}

	b.onClose("admin socket", adminLn.Close)
	b.run("admin", func(ctx context.Context) error { return serveGRPC(ctx, b.admin, adminLn) })

	if b.cfg.HTTPListen != "" {
		httpLn, err := net.Listen("tcp", b.cfg.HTTPListen)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}

		b.onClose("http listener", httpLn.Close)
		b.ctrl.httpAddr = httpLn.Addr()

		var h http.Handler = b.mux
		if b.httpAccess != nil {
			if httpLn, h, err = b.httpAccess(httpLn); err != nil {
				return err
			}
		}

		b.run("http", func(ctx context.Context) error { return serveHTTP(ctx, httpLn, h) })
	}

	b.log.Info("controller built",
		zap.Stringer("uplink", b.ctrl.uplinkAddr), zap.Bool("standby_capable", b.elector != nil),
		zap.String("admin_socket", b.cfg.AdminSocketPath()),
		zap.String("ca_fingerprint", fmt.Sprintf("%x", b.ca.Fingerprint())),
	)

	return nil
}

// registerAll registers collectors, failing on the first that clashes (a programming error, but one that
// should stop the start with a message rather than a panic).
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}

	return nil
}

// siteAssets is the controller's side of boot assets: per-site policy and state (the catalog), the relay that
// streams files to edges, what each site must hold (the agent image, plus what its plans name), and the local
// install files plans may name.
type siteAssets struct {
	catalog *assets.Catalog
	relay   *assets.Relay
	needs   *assets.Needs
	install *assets.InstallFiles
	// resolver is where install assets come from (nil: nowhere, a controller without Omni and a factory).
	resolver installSource
}

// newSiteAssets builds the catalog with each site's stored policy, the relay over the controller's asset
// directory and the needs of every known site.
func (b *builder) newSiteAssets(ctx context.Context) error {
	metrics := assets.NewMetrics()
	if err := registerAll(b.metrics, metrics); err != nil {
		return err
	}

	catalog := assets.NewCatalog(b.cfg.DefaultAssetPolicy, time.Now).CountInto(metrics)

	list, err := b.registry.List(ctx) // each site's own policy comes with its settings (newSiteSettings)
	if err != nil {
		return err
	}

	dir := b.cfg.AssetsDirPath()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("asset directory: %w", err)
	}

	relay, err := assets.NewRelay(assets.DefaultRelay(), assets.DirFiles{Dir: dir}, catalog, sites.SiteFromContext, b.log)
	if err != nil {
		return err
	}

	var agentRefs []*assetspb.AssetRef

	if b.cfg.AgentAssetsDir != "" {
		if agentRefs, err = assets.LoadAgentImages(b.cfg.AgentAssetsDir, dir); err != nil {
			return err
		}

		b.log.Info("agent-mode assets offered to every site", zap.Int("assets", len(agentRefs)))
	}

	client, err := assets.UpstreamClient([]byte(b.trustedRoots))
	if err != nil {
		return err
	}

	libraryCfg := assets.DefaultLibrary(dir, client)
	libraryCfg.Metrics = metrics

	library, err := assets.NewLibrary(libraryCfg, b.log)
	if err != nil {
		return err
	}

	needs := assets.NewNeeds(catalog, library, agentRefs)

	for _, site := range list {
		needs.Site(site.Metadata().ID())
	}

	b.run("install assets", library.Run)
	b.run("site asset needs", needs.RunLibrary)

	// Without Omni a controller may have no install source: it then plans nothing and stages nothing.
	var resolver installSource
	if b.cfg.InstallAssetsDir != "" || b.cfg.ImageFactoryURL != "" {
		if resolver, err = installResolver(b.cfg); err != nil {
			return err
		}
	}

	b.assets = &siteAssets{
		catalog: catalog, relay: relay, needs: needs, resolver: resolver,
		install: assets.NewInstallFiles(b.cfg.InstallAssetsDir, b.cfg.InstallAssetsURL, dir),
	}

	return nil
}
