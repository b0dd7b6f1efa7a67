// Package app is the edge's composition root. Build constructs every component from the configuration and
// opens every socket, starting nothing; Run runs the components under one errgroup, stops them all when one
// ends, and closes what Build opened once every one has returned.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/intents"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/limits"
	"github.com/outpost-metal/outpost/edge/registry"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/uplink"
)

// Options are what a caller that is not the edge binary changes in how the edge is put together. The edge
// binary gives none; the lab's edges (qemu/) use them.
type Options struct {
	// ControllerAPI, when set, replaces the uplink: the services the controller reaches over the uplink
	// (boot plans, BMC operations, assets, the agent call proxy) are served on this listener as plain
	// HTTP/2 gRPC without authentication, and no controller is dialled. It is for the lab, which plays the
	// controller itself; never for a site network. The edge owns it from Build on and closes it.
	ControllerAPI net.Listener
	// WrapHTTP wraps the HTTP server's handler (the lab logs every request and notes /config fetches).
	WrapHTTP func(http.Handler) http.Handler
	// Tap is told what the edge serves, beside the journal (the lab prints it to follow a boot chain).
	Tap Tap
	// FilesDir is the directory of plain files served under /assets/, instead of <state>/files (the lab's
	// boot images).
	FilesDir string
}

// Edge is a built edge: every component constructed and every socket open, nothing running.
type Edge struct {
	log        *zap.Logger
	components []component
	closers    []closer
	addrs      Addrs
	ran        atomic.Bool
}

// Addrs are the addresses the edge serves on (TFTP nil when it is off).
type Addrs struct {
	HTTP, API, TFTP net.Addr
}

// Run builds the edge and runs it until ctx ends (the edge binary).
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	e, err := Build(ctx, cfg, log, Options{})
	if err != nil {
		return err
	}

	return e.Run(ctx)
}

// Build constructs every component of the edge and opens its sockets; nothing runs until Run. A failure
// names the component and closes what was opened before it. ctx bounds the construction only (the import of
// pre-seeded assets).
func Build(ctx context.Context, cfg config.Config, log *zap.Logger, opts Options) (_ *Edge, err error) {
	e := &Edge{log: log}

	if opts.ControllerAPI != nil {
		e.closeListener("controller API listener", opts.ControllerAPI)
		// The uplink is not built: the configuration need not name a controller.
		cfg.Uplink.ControllerAddress = opts.ControllerAPI.Addr().String()
	}

	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll(e.closers))
		}
	}()

	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}

	cfg = cfg.Resolved()

	if err := e.build(ctx, cfg, opts); err != nil {
		return nil, err
	}

	return e, nil
}

// build constructs the components in dependency order; each step's closer is added as soon as it opened.
//
// one straight sequence of constructions, each with its own named error
func (e *Edge) build(ctx context.Context, cfg config.Config, opts Options) error {
	log := e.log

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	table, err := boot.Open(boot.Config{StateDir: cfg.StateDir}, log)
	if err != nil {
		return fmt.Errorf("boot table: %w", err)
	}

	jcfg := journal.Default()
	jcfg.Dir = cfg.StateDir

	jrnl, err := journal.Open(jcfg, log, journal.Deps{})
	if err != nil {
		return fmt.Errorf("event journal: %w", err)
	}

	e.closers = append(e.closers, closer{"event journal", jrnl.Close})

	// The boot evidence agent tunnels are bound to outlives the edge's restarts (its state directory).
	book, err := tunnel.LoadBootBook(cfg.StateDir, time.Now, log)
	if err != nil {
		return err
	}
	events := siteEvents{rec: journal.NewRecorder(jrnl, log), book: book, tap: opts.Tap}

	catalog, err := bootfiles.LoadCatalog(cfg.IPXEDir, cfg.DHCP.Files.Names())
	if err != nil {
		return fmt.Errorf("iPXE binaries: %w", err)
	}

	// an enrolled edge imports only bundles of its own controller (pre-seeded ones included)
	if cfg.Assets.Controller, err = uplink.ControllerFingerprint(cfg.StateDir); err != nil {
		return fmt.Errorf("edge identity: %w", err)
	}

	store, err := assetcache.New(cfg.Assets, log, nil, time.Now)
	if err != nil {
		return fmt.Errorf("asset cache: %w", err)
	}

	if cfg.AssetsPreseedDir != "" {
		refs, err := store.Import(ctx, cfg.AssetsPreseedDir)
		if err != nil {
			return fmt.Errorf("pre-seeded assets from %s: %w", cfg.AssetsPreseedDir, err)
		}

		log.Info("pre-seeded assets imported", zap.Int("assets", len(refs)))
	}

	fetcher, err := assetcache.NewFetcher(cfg.Fetcher, store, assetcache.HTTPSource{Client: factoryClient()}, log)
	if err != nil {
		return fmt.Errorf("asset fetcher: %w", err)
	}

	// Each destructive or disruptive call the controller sends with an intent ID is carried out at most once.
	icfg := intents.Default()
	icfg.Dir = cfg.StateDir

	carried, err := intents.Open(icfg, log, time.Now)
	if err != nil {
		return fmt.Errorf("intent store: %w", err)
	}

	e.closers = append(e.closers, closer{"intent store", carried.Close})

	tunnels := tunnel.New(tunnel.Options{
		Binding: cfg.AgentBinding, Evidence: book, Logger: log, Events: events, Addresses: book, Limits: cfg.Tunnels, Intents: carried,
	})

	bmcs, err := bmc.New(cfg.BMC, log, time.Now)
	if err != nil {
		return fmt.Errorf("bmc: %w", err)
	}

	e.closers = append(e.closers, closer{"bmc sessions", func() error { bmcs.Close(); return nil }})

	// The edge watches its BMCs itself and journals power changes (the controller sends the list).
	watcher := bmc.NewWatcher(bmcs, events.rec, bmc.DefaultWatcher(), log, time.Now)

	// /assets/: the cache, then the operator's files directory.
	served, err := assetcache.NewHandler(store, cmp.Or(opts.FilesDir, filepath.Join(cfg.StateDir, "files")))
	if err != nil {
		return fmt.Errorf("assets: %w", err)
	}

	e.closers = append(e.closers, closer{"files directory", served.Close})

	// /v2/: the read-only OCI registry over the same cache (installer images the controller relayed).
	oci := registry.New(store, log)

	httpSrv, err := httpd.New(cfg.HTTP, log, httpd.Deps{
		Table:      table,
		Catalog:    catalog,
		Observer:   events,
		Assets:     served,
		Registry:   oci,
		Upstream:   func() httpd.UpstreamRule { return upstreamRule(fetcher.Policy()) },
		Registerer: metrics,
		Gatherer:   metrics,
	})
	if err != nil {
		return fmt.Errorf("http server: %w", err)
	}

	e.closers = append(e.closers, closer{"http server", httpSrv.Close})

	for _, cs := range [][]prometheus.Collector{tunnels.Collectors(), bmcs.Collectors(), watcher.Collectors(), store.Collectors(), table.Collectors(), oci.Collectors(), carried.Collectors()} {
		metrics.MustRegister(cs...)
	}

	register := []func(grpc.ServiceRegistrar){
		boot.NewService(table).Register,
		intents.WrapBMC(bmc.NewService(bmcs).WithWatcher(watcher).WithBootEnded(tunnels.EndBoot), carried).Register,
		intents.NewService(carried).Register,
		assetcache.NewService(fetcher).Register,
	}

	// Agent calls from the controller (/management.AgentService/*) go to the machine's tunnel.
	controllerRun, err := e.controllerLink(cfg, opts, register, tunnels.ServerOption(), []uplink.SessionFunc{
		controllerSession(jrnl, tunnels, table, log), fetcher.OnSession,
	}, statusCounters(jrnl, table))
	if err != nil {
		return err
	}

	var lc net.ListenConfig

	httpLn, err := lc.Listen(ctx, "tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}

	e.closeListener("http listener", httpLn)

	if need, have := cfg.OpenFiles(), limits.OpenFilesLimit(); have > 0 && need > have {
		log.Warn("the connection and transfer limits let the site network open more files than this process may: lower them or raise its open-files limit",
			zap.Int("limits_allow", need), zap.Int("open_files_limit", have))
	}

	apiLn, err := lc.Listen(ctx, "tcp", cfg.APIListen)
	if err != nil {
		return fmt.Errorf("agent API listener: %w", err)
	}

	e.closeListener("agent API listener", apiLn)

	handler := httpSrv.Handler()
	if opts.WrapHTTP != nil {
		handler = opts.WrapHTTP(handler)
	}

	e.addrs = Addrs{HTTP: httpLn.Addr(), API: apiLn.Addr()}
	e.components = append(e.components,
		controllerRun,
		component{"http", func(ctx context.Context) error { return httpSrv.Serve(ctx, httpLn, handler) }},
		component{"agent API", func(ctx context.Context) error { return tunnels.Serve(ctx, apiLn) }},
		component{"asset fetcher", fetcher.Run},
		component{"bmc sessions", bmcs.Run},
		component{"bmc watcher", watcher.Run},
		component{"boot evidence", book.Run},
	)

	if cfg.TFTP.Listen != "" {
		tftpSrv, err := tftp.New(cfg.TFTP, log, catalog, tftp.Deps{Registerer: metrics, Observer: events})
		if err != nil {
			return fmt.Errorf("tftp server: %w", err)
		}

		conn, err := lc.ListenPacket(ctx, "udp4", cfg.TFTP.Listen)
		if err != nil {
			return fmt.Errorf("tftp listener: %w", err)
		}

		e.closePacketConn("tftp socket", conn)
		e.addrs.TFTP = conn.LocalAddr()
		e.components = append(e.components, component{"tftp", func(ctx context.Context) error { return tftpSrv.Serve(ctx, conn) }})
	}

	if !cfg.DHCPEnabled() {
		log.Warn("ProxyDHCP is off: no interface or server address configured (the site's DHCP server must hand out the boot file)")

		return nil
	}

	leases, err := dhcp.OpenLeases(cfg.StateDir, log)
	if err != nil {
		return fmt.Errorf("dhcp leases: %w", err)
	}

	var dhcpSrv *dhcp.Server

	deps := dhcp.Deps{Bootable: catalog.Has, Prefs: table, Observer: events, Registerer: metrics, Site: table, Leases: leases}

	if deps.Guard, deps.Probe, err = segmentChecks(cfg, log, metrics, func() bool { return dhcpSrv.FullWanted() }); err != nil {
		return err
	}

	if dhcpSrv, err = dhcp.New(cfg.DHCP, log, deps); err != nil {
		return fmt.Errorf("proxydhcp: %w", err)
	}

	if deps.Guard != nil {
		e.components = append(e.components, component{"dhcp guard", deps.Guard.Run})
	}

	var conns [2]net.PacketConn

	for i, port := range []int{cfg.DHCP.Port, cfg.DHCP.PXEPort} {
		if conns[i], err = dhcp.ListenPacket(ctx, cfg.DHCP.Interface, port, cfg.DHCP.ReadBuffer); err != nil {
			return fmt.Errorf("proxydhcp socket on port %d: %w", port, err)
		}

		e.closePacketConn(fmt.Sprintf("proxydhcp socket %d", port), conns[i])
	}

	e.components = append(e.components, component{"proxydhcp", func(ctx context.Context) error { return dhcpSrv.Serve(ctx, conns[0], conns[1]) }})

	return nil
}

// segmentChecks builds what full DHCP mode needs of the site segment: the guard against a second DHCP server and
// the ARP probe of an address before it is offered. Without an interface (tests) there are none, and full
// mode serves unguarded.
func segmentChecks(cfg config.Config, log *zap.Logger, reg prometheus.Registerer, wanted func() bool) (*dhcp.Guard, dhcp.Prober, error) {
	if cfg.DHCP.Interface == "" {
		return nil, nil, nil
	}

	ifi, err := net.InterfaceByName(cfg.DHCP.Interface)
	if err != nil {
		return nil, nil, fmt.Errorf("dhcp interface: %w", err)
	}

	guard, err := dhcp.NewGuard(dhcp.GuardConfig{Interval: cfg.DHCP.GuardInterval}, log, dhcp.RawDiscoverer{Interface: ifi.Name, Window: 3 * time.Second},
		dhcp.GuardMAC(ifi.HardwareAddr), wanted, reg)
	if err != nil {
		return nil, nil, fmt.Errorf("dhcp guard: %w", err)
	}

	probe, err := dhcp.NewARPProber(ifi.Name)
	if err != nil {
		log.Warn("addresses are offered unprobed in full DHCP mode", zap.Error(err))

		return guard, nil, nil
	}

	return guard, probe, nil
}

// controllerLink builds what connects the edge to its controller: the uplink, or the lab's plain listener
// (Options.ControllerAPI) serving the same services.
func (e *Edge) controllerLink(cfg config.Config, opts Options, register []func(grpc.ServiceRegistrar), proxy grpc.ServerOption,
	sessions []uplink.SessionFunc, counters func() map[string]int64,
) (component, error) {
	if opts.ControllerAPI != nil {
		srv := grpc.NewServer(proxy)
		for _, r := range register {
			r(srv)
		}

		return component{"controller API", func(ctx context.Context) error { return serveControllerAPI(ctx, srv, opts.ControllerAPI) }}, nil
	}

	link, err := uplink.New(cfg.Uplink, uplink.Options{
		Logger: e.log, Register: register, ServerOptions: []grpc.ServerOption{proxy}, OnSession: sessions, Counters: counters,
	})
	if err != nil {
		return component{}, fmt.Errorf("uplink: %w", err)
	}

	return component{"uplink", link.Run}, nil
}

func (e *Edge) closeListener(name string, ln net.Listener) {
	e.closers = append(e.closers, closer{name, func() error { return ignoreClosed(ln.Close()) }})
}

func (e *Edge) closePacketConn(name string, c net.PacketConn) {
	e.closers = append(e.closers, closer{name, func() error { return ignoreClosed(c.Close()) }})
}

// ignoreClosed drops the error of closing what its server already closed.
func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}

	return err
}

// Run runs every component until ctx ends or one of them ends: an error, or a component returning on its
// own (ErrEndedEarly), stops all the others and is returned, naming the component. Once every component
// has returned, Run closes what Build opened. It returns nil when ctx ended and everything stopped cleanly.
// An edge runs once.
func (e *Edge) Run(ctx context.Context) error {
	if !e.ran.CompareAndSwap(false, true) {
		return errors.New("edge: already run")
	}

	e.log.Info("edge starting", zap.Stringer("http", e.addrs.HTTP), zap.Stringer("agent_api", e.addrs.API))

	err := runComponents(ctx, e.log, e.components)

	return errors.Join(err, closeAll(e.closers))
}

// Close closes what Build opened, for an edge that is not run (Run closes it itself).
func (e *Edge) Close() error {
	if !e.ran.CompareAndSwap(false, true) {
		return nil
	}

	return closeAll(e.closers)
}

// upstreamRule is the site's asset policy as the boot scripts and /config apply it.
func upstreamRule(p assetcache.Policy) httpd.UpstreamRule {
	switch p {
	case assetcache.PolicyOffline:
		return httpd.UpstreamNever
	case assetcache.PolicyCache:
		return httpd.UpstreamViaEdge
	default:
		return httpd.UpstreamAllowed
	}
}
