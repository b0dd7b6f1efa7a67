package app

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
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
	"github.com/outpost-metal/outpost/edge/vmedia"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// builder holds what Build has constructed so far; each step reads what earlier steps made and adds its own,
// its components and closers going to the edge's run group as soon as they exist.
type builder struct {
	cfg  config.Config
	opts Options
	log  *zap.Logger
	edge *Edge
	lc   net.ListenConfig

	metrics *prometheus.Registry
	table   *boot.Table
	jrnl    *journal.Journal
	book    *tunnel.BootBook
	events  siteEvents
	catalog *bootfiles.Catalog
	store   *assetcache.Store
	fetcher *assetcache.Fetcher
	// dhcpSrv is the ProxyDHCP server once newDHCP built it (nil: off, or not yet).
	dhcpSrv atomic.Pointer[dhcp.Server]
	// served is /assets/: the cache, then the operator's files directory (newHTTP builds it).
	served  *assetcache.Handler
	carried *intents.Store
	tunnels *tunnel.Server
	// bmcAPI answers the controller's BMC calls (edge/bmc's, or Options.BMCs).
	bmcAPI bmcpb.BMCServer
	// console serves machines' serial consoles over IPMI SOL (nil with Options.BMCs).
	console *bmc.ConsoleService
	httpSrv *httpd.Server
}

// steps are Build's construction steps, in dependency order. Each builds one part of the edge and names it
// in the error it returns.
func (b *builder) steps() []func(ctx context.Context) error {
	return []func(ctx context.Context) error{
		b.newMetrics,
		b.openBootTable,
		b.openJournal,
		b.loadBootEvidence,
		b.loadIPXE,
		b.openAssetCache,
		b.newFetcher,
		b.openIntents,
		b.newTunnels,
		b.newBMCs,
		b.newHTTP,
		b.newControllerLink,
		b.listen,
		b.newTFTP,
		b.newDHCP,
	}
}

// run adds a long-running component to the edge's run group.
func (b *builder) run(name string, fn func(ctx context.Context) error) {
	b.edge.group.Go(name, fn)
}

// onClose adds something to close once every component has returned (or when a later step fails).
func (b *builder) onClose(name string, fn func() error) {
	b.edge.group.OnClose(name, fn)
}

func (b *builder) newMetrics(context.Context) error {
	b.metrics = prometheus.NewRegistry()
	b.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	return nil
}

func (b *builder) openBootTable(context.Context) error {
	table, err := boot.Open(boot.Config{StateDir: b.cfg.StateDir}, b.log)
	if err != nil {
		return fmt.Errorf("boot table: %w", err)
	}

	b.metrics.MustRegister(table.Collectors()...)
	b.table = table

	return nil
}

func (b *builder) openJournal(context.Context) error {
	jcfg := journal.Default()
	jcfg.Dir = b.cfg.StateDir

	jrnl, err := journal.Open(jcfg, b.log, journal.Deps{})
	if err != nil {
		return fmt.Errorf("event journal: %w", err)
	}

	b.onClose("event journal", jrnl.Close)
	b.jrnl = jrnl

	return nil
}

// loadBootEvidence loads the boot evidence agent tunnels are bound to, which outlives the edge's restarts (its
// state directory), and puts together where the boot servers report what they see.
func (b *builder) loadBootEvidence(context.Context) error {
	book, err := tunnel.LoadBootBook(b.cfg.StateDir, time.Now, b.log)
	if err != nil {
		return err
	}

	b.run("boot evidence", book.Run)
	b.book = book
	b.events = siteEvents{rec: journal.NewRecorder(b.jrnl, b.log), book: book, tap: b.opts.Tap}
	b.edge.rec = b.events.rec

	return nil
}

func (b *builder) loadIPXE(context.Context) error {
	catalog, err := bootfiles.LoadCatalog(b.cfg.IPXEDir, b.cfg.DHCP.Files.Names())
	if err != nil {
		return fmt.Errorf("iPXE binaries: %w", err)
	}

	b.catalog = catalog

	return nil
}

// openAssetCache opens the content-addressed asset cache and imports the pre-seeded assets into it: an
// enrolled edge imports only bundles of its own controller (pre-seeded ones included).
func (b *builder) openAssetCache(ctx context.Context) error {
	var err error

	if b.cfg.Assets.Controller, err = uplink.ControllerFingerprint(b.cfg.StateDir); err != nil {
		return fmt.Errorf("edge identity: %w", err)
	}

	store, err := assetcache.New(b.cfg.Assets, b.log, time.Now)
	if err != nil {
		return fmt.Errorf("asset cache: %w", err)
	}

	b.metrics.MustRegister(store.Collectors()...)
	b.store = store

	if b.cfg.AssetsPreseedDir != "" {
		refs, err := store.Import(ctx, b.cfg.AssetsPreseedDir)
		if err != nil {
			return fmt.Errorf("pre-seeded assets from %s: %w", b.cfg.AssetsPreseedDir, err)
		}

		b.log.Info("pre-seeded assets imported", zap.Int("assets", len(refs)))
	}

	return nil
}

func (b *builder) newFetcher(context.Context) error {
	var upstream assetcache.Source = assetcache.HTTPSource{Client: factoryClient()}
	if b.opts.Upstream != nil {
		upstream = b.opts.Upstream
	}

	fetcher, err := assetcache.NewFetcher(b.cfg.Fetcher, b.store, upstream, b.log)
	if err != nil {
		return fmt.Errorf("asset fetcher: %w", err)
	}

	b.run("asset fetcher", fetcher.Run)
	b.fetcher = fetcher

	return nil
}

// openIntents opens the store through which each destructive or disruptive call the controller sends with an
// intent ID is carried out at most once.
func (b *builder) openIntents(context.Context) error {
	icfg := intents.Default()
	icfg.Dir = b.cfg.StateDir

	carried, err := intents.Open(icfg, b.log, time.Now)
	if err != nil {
		return fmt.Errorf("intent store: %w", err)
	}

	b.onClose("intent store", carried.Close)
	b.metrics.MustRegister(carried.Collectors()...)
	b.carried = carried

	return nil
}

// newTunnels builds the server of the machine agents' tunnels (served by listen).
func (b *builder) newTunnels(context.Context) error {
	b.tunnels = tunnel.New(tunnel.Options{
		Binding: b.cfg.AgentBinding, Evidence: b.book, Logger: b.log, Events: b.events, Addresses: b.book,
		Limits: b.cfg.Tunnels, Intents: b.carried,
	})
	b.metrics.MustRegister(b.tunnels.Collectors()...)

	return nil
}

// newBMCs builds the BMC sessions and the watch of their power, which the edge keeps itself and journals
// (the controller sends the list), unless Options.BMCs answers for the BMCs.
func (b *builder) newBMCs(context.Context) error {
	if b.opts.BMCs != nil {
		b.bmcAPI = b.opts.BMCs

		return nil
	}

	bmcs, err := bmc.New(b.cfg.BMC, b.log, time.Now)
	if err != nil {
		return fmt.Errorf("bmc: %w", err)
	}

	b.onClose("bmc sessions", func() error { bmcs.Close(); return nil })

	watcher := bmc.NewWatcher(bmcs, b.events.rec, bmc.DefaultWatcher(), b.log, time.Now)

	b.metrics.MustRegister(bmcs.Collectors()...)
	b.metrics.MustRegister(watcher.Collectors()...)
	b.run("bmc sessions", bmcs.Run)
	b.run("bmc watcher", watcher.Run)
	b.bmcAPI = bmc.NewService(bmcs).WithWatcher(watcher).WithBootEnded(b.tunnels.EndBoot)
	b.console = bmc.NewConsoleService(bmcs).WithJournal(b.events.rec)
	b.metrics.MustRegister(b.console.Collectors()...)

	return nil
}

// newHTTP builds the HTTP server: boot scripts and files, /assets/ (the cache, then the operator's files
// directory) and /v2/ (the read-only OCI registry over the same cache: installer images the controller
// relayed).
func (b *builder) newHTTP(context.Context) error {
	served, err := assetcache.NewHandler(b.store, cmp.Or(b.opts.FilesDir, filepath.Join(b.cfg.StateDir, "files")))
	if err != nil {
		return fmt.Errorf("assets: %w", err)
	}

	b.onClose("files directory", served.Close)
	b.served = served

	oci := registry.New(b.store, b.log)
	b.metrics.MustRegister(oci.Collectors()...)

	upstream := func() httpd.UpstreamRule { return upstreamRule(b.fetcher.Policy()) }
	deps := httpd.Deps{
		Table:      b.table,
		Catalog:    b.catalog,
		Observer:   b.events,
		Assets:     served,
		Coming:     b.fetcher,
		Registry:   oci,
		Upstream:   upstream,
		Registerer: b.metrics,
		Gatherer:   b.metrics,
	}

	if host := b.cfg.HTTP.ReachableHost(); host == "" {
		b.log.Info("virtual media off: BMCs could not reach the images without the edge's site address (--advertise-host)")
	} else {
		store, err := vmedia.NewStore(vmedia.Config{Dir: filepath.Join(b.cfg.StateDir, "vmedia"), Loader: cmp.Or(b.cfg.VMediaLoader, filepath.Join(b.cfg.IPXEDir, config.VMediaLoaderName)), BaseURL: "http://" + host},
			imagePlanner{cfg: b.cfg.HTTP, host: host, table: b.table, assets: served, upstream: upstream}, served, b.table.DHCP)
		if err != nil {
			return err
		}

		deps.VirtualMedia = store
		if svc, ok := b.bmcAPI.(*bmc.Service); ok { // the fleet simulator's own BMCs boot no images
			svc.WithImages(images{store: store, book: b.book})
		}
	}

	httpSrv, err := httpd.New(b.cfg.HTTP, b.log, deps)
	if err != nil {
		return fmt.Errorf("http server: %w", err)
	}

	b.onClose("http server", httpSrv.Close)
	b.httpSrv = httpSrv

	return nil
}

// newControllerLink builds what connects the edge to its controller: the uplink, or the lab's plain listener
// (Options.ControllerAPI) serving the same services. Agent calls from the controller
// (/management.AgentService/*) go to the machine's tunnel.
func (b *builder) newControllerLink(context.Context) error {
	register := []func(grpc.ServiceRegistrar){
		boot.NewService(b.table, b.reach).Register,
		intents.WrapBMC(b.bmcAPI, b.carried).Register,
		intents.NewService(b.carried).Register,
		assetcache.NewService(b.fetcher).Register,
	}
	if b.console != nil {
		register = append(register, b.console.Register)
	}

	proxy := b.tunnels.ServerOption()

	if api := b.opts.ControllerAPI; api != nil {
		srv := grpc.NewServer(proxy)
		for _, r := range register {
			r(srv)
		}

		b.run("controller API", func(ctx context.Context) error { return serveControllerAPI(ctx, srv, api) })

		return nil
	}

	link, err := uplink.New(b.cfg.Uplink, uplink.Options{
		Logger: b.log, Register: register, ServerOptions: []grpc.ServerOption{proxy},
		OnSession: []uplink.SessionFunc{controllerSession(b.jrnl, b.tunnels, b.table, b.log), b.fetcher.OnSession},
		Counters:  statusCounters(b.jrnl, b.table), Dial: b.opts.Dial,
	})
	if err != nil {
		return fmt.Errorf("uplink: %w", err)
	}

	b.run("uplink", link.Run)

	return nil
}

// listen opens the HTTP and agent API listeners and adds their servers.
func (b *builder) listen(ctx context.Context) error {
	httpLn, err := b.lc.Listen(ctx, "tcp", b.cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}

	b.onClose("http listener", httpLn.Close)

	if need, have := b.cfg.OpenFiles(), limits.OpenFilesLimit(); have > 0 && need > have {
		b.log.Warn("the connection and transfer limits let the site network open more files than this process may: lower them or raise its open-files limit",
			zap.Int("limits_allow", need), zap.Int("open_files_limit", have))
	}

	apiLn, err := b.lc.Listen(ctx, "tcp", b.cfg.APIListen)
	if err != nil {
		return fmt.Errorf("agent API listener: %w", err)
	}

	b.onClose("agent API listener", apiLn.Close)

	handler := b.httpSrv.Handler()
	if b.opts.WrapHTTP != nil {
		handler = b.opts.WrapHTTP(handler)
	}

	b.edge.addrs = Addrs{HTTP: httpLn.Addr(), API: apiLn.Addr()}
	b.run("http", func(ctx context.Context) error { return b.httpSrv.Serve(ctx, httpLn, handler) })
	b.run("agent API", func(ctx context.Context) error { return b.tunnels.Serve(ctx, apiLn) })

	return nil
}

// newTFTP builds the TFTP server and opens its socket, when one is configured.
func (b *builder) newTFTP(ctx context.Context) error {
	if b.cfg.TFTP.Listen == "" {
		return nil
	}

	tftpSrv, err := tftp.New(b.cfg.TFTP, b.log, b.catalog, tftp.Deps{Registerer: b.metrics, Observer: b.events})
	if err != nil {
		return fmt.Errorf("tftp server: %w", err)
	}

	conn, err := b.lc.ListenPacket(ctx, "udp4", b.cfg.TFTP.Listen)
	if err != nil {
		return fmt.Errorf("tftp listener: %w", err)
	}

	b.onClose("tftp socket", conn.Close)
	b.edge.addrs.TFTP = conn.LocalAddr()
	b.run("tftp", func(ctx context.Context) error { return tftpSrv.Serve(ctx, conn) })

	return nil
}

// reach is how the site's machines reach this edge, for the controller to bake into signed images (their
// command line is locked): the HTTP server's reachable host, else the ProxyDHCP's own address and HTTP port
// (where it sends HTTP boot clients); nil when neither is known.
func (b *builder) reach() *bootpb.Reach {
	host := b.cfg.HTTP.ReachableHost()
	if srv := b.dhcpSrv.Load(); host == "" && srv != nil {
		host = strings.TrimPrefix(srv.Params().HTTPBase(), "http://")
	}

	if host == "" {
		return nil
	}

	base, agent, ok := b.cfg.HTTP.Reach(host)
	if !ok {
		return nil
	}

	return &bootpb.Reach{HttpBase: base, AgentAddress: agent}
}

// newDHCP builds the ProxyDHCP server (or full DHCP) and opens its sockets, when the configuration names an
// interface or a server address.
func (b *builder) newDHCP(ctx context.Context) error {
	if !b.cfg.DHCPEnabled() {
		b.log.Warn("ProxyDHCP is off: no interface or server address configured (the site's DHCP server must hand out the boot file)")

		return nil
	}

	leases, err := dhcp.OpenLeases(b.cfg.StateDir, b.log)
	if err != nil {
		return fmt.Errorf("dhcp leases: %w", err)
	}

	var dhcpSrv *dhcp.Server

	deps := dhcp.Deps{
		Bootable: b.catalog.Has, Held: b.served.Has, Upstream: func() bool { return upstreamRule(b.fetcher.Policy()) == httpd.UpstreamAllowed },
		Prefs: b.table, Observer: b.events, Registerer: b.metrics, Site: b.table, Leases: leases,
	}

	if deps.Guard, deps.Probe, err = segmentChecks(b.cfg, b.log, b.metrics, func() bool { return dhcpSrv.FullWanted() }); err != nil {
		return err
	}

	if dhcpSrv, err = dhcp.New(b.cfg.DHCP, b.log, deps); err != nil {
		return fmt.Errorf("proxydhcp: %w", err)
	}

	b.dhcpSrv.Store(dhcpSrv)

	if deps.Guard != nil {
		b.run("dhcp guard", deps.Guard.Run)
	}

	var conns [2]net.PacketConn

	for i, port := range []int{b.cfg.DHCP.Port, b.cfg.DHCP.PXEPort} {
		if conns[i], err = dhcp.ListenPacket(ctx, b.cfg.DHCP.Interface, port, b.cfg.DHCP.ReadBuffer); err != nil {
			return fmt.Errorf("proxydhcp socket on port %d: %w", port, err)
		}

		b.onClose(fmt.Sprintf("proxydhcp socket %d", port), conns[i].Close)
	}

	b.run("proxydhcp", func(ctx context.Context) error { return dhcpSrv.Serve(ctx, conns[0], conns[1]) })

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
