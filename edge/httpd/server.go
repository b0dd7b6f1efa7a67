// Package httpd is the edge's HTTP server: the iPXE scripts (/ipxe/init.ipxe, /ipxe/boot.ipxe answered from
// the boot table), the iPXE binaries for UEFI HTTP boot (/tftp/<file>), boot assets (/assets/, mounted
// from edge/assetcache, which owns it), the Talos machine config the controller last
// sent (/config), the edge's read-only OCI registry (/v2/, mounted from edge/registry), /metrics and /healthz.
//
// What boot.ipxe answers is decided by Decide (decide.go), a function of the request, the machine's plan,
// the assets at hand and the time; the handlers (handlers.go) gather those and write the answer.
package httpd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/limits"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Table is the boot table as the server reads it (edge/boot.Table).
type Table interface {
	Lookup(uuid metal.ID, mac net.HardwareAddr, arch metal.Arch) boot.Entry
	MachineConfig(uuid string) []byte
	// SignedImage is the signed image the machine boots in its mode (nil: none).
	SignedImage(mac net.HardwareAddr, uuid string, arch metal.Arch) *bootpb.SignedImage
}

// BootServed describes an answered boot.ipxe, for the event journal.
type BootServed struct {
	UUID         metal.ID
	MAC          net.HardwareAddr
	Build        bootpb.IPXEArch
	Platform     bootpb.IPXEPlatform
	Mode         Mode
	Remote       netip.Addr
	TableVersion uint64
	// Missing and WaitingFor, in mode "wait", name the assets the machine waits for and the mode it waits to boot.
	Missing    []string
	WaitingFor Mode
	// SignedImage is the /assets/ name of the signed image served in place of a boot script ("": a script).
	SignedImage string
}

// Observer is told about served boot scripts and binaries (after the response has been flushed).
type Observer interface {
	BootServed(BootServed)
	HTTPFetch(bootfiles.Fetch)
}

// AssetIndex is what the edge serves under /assets/, as the boot scripts see it.
type AssetIndex interface {
	// Has reports whether the edge serves /assets/<name> now.
	Has(name string) bool
}

// ComingIndex says which /assets/ names the edge is fetching now (edge/assetcache.Fetcher).
type ComingIndex interface {
	// Coming reports whether /assets/<name> is being fetched, so that a boot needing it can wait for it.
	Coming(name string) bool
}

// Assets owns /assets/: it says which names it serves and serves them (the asset cache and the operator's
// files directory, edge/assetcache.Handler).
type Assets interface {
	AssetIndex
	http.Handler
}

// Deps are the server's collaborators. Table and Catalog are required.
type Deps struct {
	Table   Table
	Catalog *bootfiles.Catalog
	// Assets serves /assets/ (optional: without it nothing is served there). A boot whose edge-local kernel
	// or initrd it does not have gets a script that waits for them.
	Assets Assets
	// Coming says which assets are on their way (optional: without it none is). An arm64 machine at a site
	// holding only x86 agent assets waits while the arm64 ones are coming, and is refused by name otherwise.
	Coming ComingIndex
	// Upstream tells how the site's machines may reach upstream install assets, from the site's asset policy
	// now (nil: UpstreamAllowed, as on an edge without a cache).
	Upstream func() UpstreamRule
	// Registry serves the OCI distribution API under /v2/, for every method (optional: without it nothing is
	// served there).
	Registry http.Handler
	// VirtualMedia serves the virtual-media images BMCs mount, /vmedia/ (optional: without it nothing is served
	// there).
	VirtualMedia http.Handler
	// Observer is optional.
	Observer Observer
	// Registerer receives this server's metrics; Gatherer is what /metrics serves (usually the same registry).
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Now is the clock (how long a machine has waited for assets); nil means time.Now.
	Now func() time.Time
}

// Server is the edge's HTTP server.
type Server struct {
	cfg     Config
	log     *zap.Logger
	deps    Deps
	metrics metrics

	// waits remembers which waiting machines were reported lately.
	waits waitReports

	conns   *limits.Limiter
	rejects *limits.RejectLog

	handler http.Handler
}

// New builds the server.
func New(cfg Config, logger *zap.Logger, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("http config: %w", err)
	}

	if deps.Table == nil || deps.Catalog == nil {
		return nil, errors.New("http server needs a boot table and a catalog")
	}

	if deps.Now == nil {
		deps.Now = time.Now
	}

	if deps.Assets == nil {
		deps.Assets = noAssets{}
	}

	if deps.Registerer == nil {
		reg := prometheus.NewRegistry()
		deps.Registerer, deps.Gatherer = reg, reg
	}

	if deps.Gatherer == nil {
		deps.Gatherer = prometheus.NewRegistry()
	}

	log := logger.With(zap.String("component", "http"))

	s := &Server{
		cfg: cfg, log: log, deps: deps, metrics: newMetrics(),
		conns:   limits.New(limits.Config{Total: cfg.MaxConns, PerSource: cfg.MaxConnsPerSource}),
		rejects: limits.NewRejectLog(log, "http connection refused", limits.DefaultLogInterval, nil),
	}

	if err := s.metrics.register(deps.Registerer, s.conns.Collector("outpost_http_connections", "HTTP connections")); err != nil {
		return nil, err
	}

	count := s.metrics.count
	mux := http.NewServeMux()
	mux.Handle("GET /ipxe/init.ipxe", count("init", http.HandlerFunc(s.serveInit)))
	mux.Handle("GET /ipxe/probe.ipxe", count("probe", http.HandlerFunc(s.serveProbe)))
	mux.Handle("GET /ipxe/boot.ipxe", count("boot", http.HandlerFunc(s.serveBoot)))
	mux.Handle("GET /tftp/{file...}", count("tftp", http.HandlerFunc(s.serveBinary)))
	assetObserver, _ := deps.Observer.(AssetObserver)
	mux.Handle("GET /assets/", count("assets", s.noteSignedBoot(guardAssets(assetObserver, cfg.StallTimeout, cfg.WriteTimeout, deps.Assets))))
	mux.Handle("GET /config", count("config", http.HandlerFunc(s.serveConfig)))
	mux.Handle("GET /metrics", count("metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{})))
	mux.Handle("GET /healthz", count("healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, "text/plain; charset=utf-8", []byte("ok\n"))
	})))

	if deps.VirtualMedia != nil {
		mux.Handle("GET /vmedia/", count("vmedia", deps.VirtualMedia))
	}

	if deps.Registry != nil { // every method: the registry answers writes with the spec's error
		mux.Handle("/v2/", count("registry", deps.Registry))
	}

	s.handler = mux

	return s, nil
}

// Handler returns the server's routes: what the edge serves (Serve).
func (s *Server) Handler() http.Handler {
	return s.handler
}

// Close writes the pending refusal counts.
func (s *Server) Close() error {
	s.rejects.Flush()

	return nil
}

// noAssets is /assets/ on an edge without assets: nothing there.
type noAssets struct{}

func (noAssets) Has(string) bool { return false }

func (noAssets) ServeHTTP(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }

// LimitListener wraps ln so that its connections count against MaxConns and MaxConnsPerSource: a connection
// over a bound is reset at once (counted in outpost_http_connections_refused_total, logged once per reason per
// interval). Every http.Server on it should set ConnState to limits.ConnState, so idle keep-alive connections
// can make room too; Serve does both.
func (s *Server) LimitListener(ln net.Listener) net.Listener {
	return limits.NewListener(ln, s.conns, s.rejects, map[limits.Reason]string{
		limits.PerSource: fmt.Sprintf("this address already holds %d connections, all busy (--http-max-conns-per-source)", s.cfg.MaxConnsPerSource),
		limits.Total:     fmt.Sprintf("%d connections open, all busy (--http-max-conns); raise it if real machines are refused", s.cfg.MaxConns),
	})
}

// shutdownGrace bounds how long Serve waits for requests in progress when ctx ends.
const shutdownGrace = 5 * time.Second

// Serve serves h on ln, within the connection bounds (LimitListener) and the configured timeouts, until ctx
// ends, then shuts down gracefully (bounded to 5 s); it returns nil then. It closes ln. h is Handler(), or a
// handler around it (the lab logs every request).
func (s *Server) Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		ConnState:         limits.ConnState, // idle keep-alive connections can make room under the connection limits
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(s.log),
	}

	errc := make(chan error, 1)

	go func() { errc <- srv.Serve(s.LimitListener(ln)) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
		// Shutdown returns once the requests in progress are answered (or the grace is over), so nothing of
		// this server runs after Serve has returned.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()

		if err := srv.Shutdown(sctx); err != nil {
			srv.Close() //nolint:errcheck
		}

		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}

		return nil
	}
}
