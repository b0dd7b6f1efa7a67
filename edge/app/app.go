// Package app is the edge's composition root: it builds every component from the configuration,
// wires them together and runs them under one errgroup.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/edge/assets"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/ipxe"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/limits"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/uplink"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Run runs the edge until ctx is done.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}

	cfg = cfg.Resolved()

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	table, err := boot.Open(boot.Config{StateDir: cfg.StateDir}, log)
	if err != nil {
		return err
	}

	jcfg := journal.Default()
	jcfg.Dir = cfg.StateDir

	jrnl, err := journal.Open(jcfg, log, journal.Deps{})
	if err != nil {
		return err
	}
	defer jrnl.Close() //nolint:errcheck

	recorder := journal.NewRecorder(jrnl, log)
	book := tunnel.NewBootBook(time.Now)

	catalog, err := tftp.LoadCatalog(cfg.IPXEDir, cfg.DHCP.Files.Names())
	if err != nil {
		return fmt.Errorf("iPXE binaries: %w", err)
	}

	needed := &neededAssets{}

	store, err := assets.New(cfg.Assets, log, needed, time.Now)
	if err != nil {
		return err
	}

	if cfg.AssetsPreseedDir != "" {
		refs, err := store.Import(ctx, cfg.AssetsPreseedDir)
		if err != nil {
			return fmt.Errorf("import pre-seeded assets from %s: %w", cfg.AssetsPreseedDir, err)
		}

		log.Info("pre-seeded assets imported", zap.Int("assets", len(refs)))
	}

	fetcher, err := assets.NewFetcher(cfg.Fetcher, store, assets.HTTPSource{Client: factoryClient()}, log)
	if err != nil {
		return err
	}

	needed.set(fetcher)

	tunnels := tunnel.New(tunnel.Options{Binding: cfg.AgentBinding, Evidence: book, Logger: log, Events: tunnelEvents{recorder}, Addresses: book, Limits: cfg.Tunnels})

	bmcs, err := bmc.New(cfg.BMC, log, time.Now)
	if err != nil {
		return err
	}

	// the edge watches its BMCs itself and journals power changes (the controller sends the list)
	watcher := bmc.NewWatcher(bmcs, recorder, bmc.DefaultWatcher(), log, time.Now)

	httpSrv, err := ipxe.New(cfg.HTTP, log, ipxe.Deps{
		Table:      table,
		Catalog:    catalog,
		Observer:   bootObserver{Recorder: recorder, book: book},
		Assets:     cachedAssets{store},
		Registerer: metrics,
		Gatherer:   metrics,
	})
	if err != nil {
		return err
	}
	defer httpSrv.Close() //nolint:errcheck

	for _, cs := range [][]prometheus.Collector{tunnels.Collectors(), bmcs.Collectors(), watcher.Collectors(), store.Collectors(), table.Collectors()} {
		metrics.MustRegister(cs...)
	}

	link, err := uplink.New(cfg.Uplink, uplink.Options{
		Logger: log,
		Register: []func(grpc.ServiceRegistrar){
			boot.NewService(table).Register,
			bmc.NewService(bmcs).WithWatcher(watcher).Register,
			assets.NewService(fetcher).Register,
		},
		// Agent calls from the controller (/management.AgentService/*) go to the machine's tunnel.
		ServerOptions: []grpc.ServerOption{tunnels.ServerOption()},
		OnSession: []uplink.SessionFunc{
			func(ctx context.Context, conn grpc.ClientConnInterface) error {
				events := bootpb.NewEventsClient(conn)
				reportInventory(ctx, events, tunnels, table, log)

				return jrnl.Deliver(ctx, events)
			},
			fetcher.OnSession,
		},
		Counters: func() map[string]int64 {
			c := jrnl.Counters()
			c["boot_table_version"] = int64(table.Version()) //nolint:gosec // versions stay far below 2^63

			return c
		},
	})
	if err != nil {
		return err
	}

	var lc net.ListenConfig

	httpLn, err := lc.Listen(ctx, "tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}

	httpLn = httpSrv.LimitListener(httpLn)

	if need, have := cfg.OpenFiles(), limits.OpenFilesLimit(); have > 0 && need > have {
		log.Warn("the connection and transfer limits let the site network open more files than this process may: lower them or raise its open-files limit",
			zap.Int("limits_allow", need), zap.Int("open_files_limit", have))
	}

	apiLn, err := lc.Listen(ctx, "tcp", cfg.APIListen)
	if err != nil {
		httpLn.Close() //nolint:errcheck

		return fmt.Errorf("agent API listener: %w", err)
	}

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return link.Run(ctx) })
	eg.Go(func() error { return serveHTTP(ctx, httpLn, cfg.HTTP, httpHandler(store, httpSrv.Handler()), log) })
	eg.Go(func() error { return tunnels.Serve(ctx, apiLn) })
	eg.Go(func() error { return fetcher.Run(ctx) })
	eg.Go(func() error { return bmcs.Run(ctx) })
	eg.Go(func() error { return watcher.Run(ctx) })

	if cfg.TFTP.Listen != "" {
		tftpSrv, err := tftp.New(cfg.TFTP, log, catalog, tftp.Deps{Registerer: metrics, Observer: recorder})
		if err != nil {
			return err
		}

		eg.Go(func() error { return tftpSrv.Run(ctx) })
	}

	if cfg.DHCPEnabled() {
		dhcpSrv, err := dhcp.New(cfg.DHCP, log, dhcp.Deps{Bootable: catalog.Has, Prefs: table, Observer: recorder, Registerer: metrics})
		if err != nil {
			return err
		}

		eg.Go(func() error { return dhcpSrv.Run(ctx) })
	} else {
		log.Warn("ProxyDHCP is off: no interface or server address configured (the site's DHCP server must hand out the boot file)")
	}

	log.Info("edge started",
		zap.String("http", httpLn.Addr().String()),
		zap.String("agent_api", apiLn.Addr().String()),
		zap.String("controller", cfg.Uplink.ControllerAddress),
	)

	return eg.Wait()
}

// reportInventory tells the controller what the edge holds at the start of a session: the open agent tunnels
// and the machines of the boot table, so a restarted controller knows the site at once. A controller that
// does not know the call, or fails it, is logged; the session goes on (events still arrive through the journal).
func reportInventory(ctx context.Context, events bootpb.EventsClient, tunnels *tunnel.Server, table *boot.Table, log *zap.Logger) {
	req := &bootpb.InventoryRequest{Tunnels: tunnels.Open(), Table: table.UUIDs(), TableVersion: table.Version()}

	resp, err := events.Inventory(ctx, req)
	if err != nil {
		log.Warn("inventory not taken by the controller", zap.Error(err))

		return
	}

	log.Info("inventory reported", zap.Int("tunnels", len(req.GetTunnels())), zap.Int("plans", len(req.GetTable())),
		zap.Uint32("refused_by_controller", resp.GetRefused()))
}

// factoryClient fetches assets from upstream (the image factory) under the cache policy.
func factoryClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		IdleConnTimeout:       90 * time.Second,
	}}
}

// cachedAssets tells the boot scripts which /assets/ names the content-addressed cache holds.
type cachedAssets struct{ store *assets.Store }

func (c cachedAssets) Has(name string) bool {
	_, err := c.store.Lookup(name)

	return err == nil
}

// httpHandler serves /assets/ from the content-addressed cache when it holds the asset, and everything else
// (including plain files placed in <state>/files) from the boot HTTP server.
func httpHandler(store *assets.Store, boot http.Handler) http.Handler {
	cached, index := assets.NewHandler(store, "/assets/"), cachedAssets{store}

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key, ok := strings.CutPrefix(r.URL.Path, "/assets/"); ok {
			if index.Has(key) {
				cached.ServeHTTP(w, r)

				return
			}
		}

		boot.ServeHTTP(w, r)
	})
}

func serveHTTP(ctx context.Context, ln net.Listener, cfg ipxe.Config, h http.Handler, log *zap.Logger) error {
	srv := &http.Server{
		ConnState:         limits.ConnState, // idle keep-alive connections can make room under the connection limits
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(log.With(zap.String("component", "http"))),
	}

	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		if srv.Shutdown(sctx) != nil {
			srv.Close() //nolint:errcheck
		}
	})
	defer stop()

	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}

	return nil
}

// bootObserver journals boot-script answers and notes where each machine asked from.
type bootObserver struct {
	*journal.Recorder

	book *tunnel.BootBook
}

func (o bootObserver) BootServed(b ipxe.BootServed) {
	o.book.Note(b.UUID, b.Remote, b.MAC)
	o.Recorder.BootServed(b)
}

// ConfigServed notes the address the booted machine fetched its config from (where its agent dials from).
func (o bootObserver) ConfigServed(uuid string, remote netip.Addr) {
	o.book.Note(uuid, remote, nil)
}

// tunnelEvents journals agent tunnels opening and closing.
type tunnelEvents struct{ rec *journal.Recorder }

func (t tunnelEvents) TunnelOpened(e tunnel.Event) { t.record(e, true) }
func (t tunnelEvents) TunnelClosed(e tunnel.Event) { t.record(e, false) }

func (t tunnelEvents) record(e tunnel.Event, open bool) {
	ev := &bootpb.AgentTunnel{MachineId: e.MachineID, Open: open, AddressMismatch: e.AddressMismatch}

	if e.RemoteAddr.IsValid() {
		ev.RemoteIp = e.RemoteAddr.Addr().String()
	}

	if e.SeenAddr.IsValid() {
		ev.SeenIp = e.SeenAddr.String()
	}

	t.rec.Record(&bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: ev}})
}

// neededAssets tells the cache which assets the site's current plans need (the ones the controller asked
// the fetcher to hold), so eviction never removes them. The fetcher is set once, after both exist.
type neededAssets struct {
	mu      sync.Mutex
	fetcher *assets.Fetcher
}

func (n *neededAssets) set(f *assets.Fetcher) {
	n.mu.Lock()
	n.fetcher = f
	n.mu.Unlock()
}

// NeededDigests implements assets.NeededSet.
func (n *neededAssets) NeededDigests() []string {
	n.mu.Lock()
	f := n.fetcher
	n.mu.Unlock()

	if f == nil {
		return nil
	}

	statuses := f.Statuses()
	out := make([]string, 0, len(statuses))

	for _, s := range statuses {
		out = append(out, s.Ref.SHA256)
	}

	return out
}
