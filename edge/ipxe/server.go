// Package ipxe is the edge's HTTP server: the iPXE scripts (/ipxe/init.ipxe, /ipxe/boot.ipxe answered from
// the boot table), the iPXE binaries for UEFI HTTP boot (/tftp/<file>), boot assets from a local directory
// (/assets/, with Range, HEAD and ETag), the Talos machine config the controller last sent (/config),
// /metrics and /healthz.
package ipxe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/limits"
	"github.com/outpost-metal/outpost/edge/tftp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Config configures the HTTP server.
type Config struct {
	// Listen is the TCP address to serve (default ":80").
	Listen string `json:"listen"`
	// AssetsDir holds the files served under /assets/.
	AssetsDir string `json:"assets_dir"`
	// AdvertiseHost is host[:port] machines use to reach this server; empty means the request's Host header.
	AdvertiseHost string `json:"advertise_host"`
	// AgentAddress is metal.provider.address for agent mode (the edge's agent tunnel endpoint);
	// empty means the advertised host with AgentPort.
	AgentAddress string `json:"agent_address"`
	// AgentPort is the port of the agent tunnel endpoint when AgentAddress is empty.
	AgentPort int `json:"agent_port"`
	// KernelArgs are used when the boot table has no table-wide args (consoles).
	KernelArgs []string `json:"kernel_args"`
	// AgentKernel and AgentInitrd are the default agent-mode paths; "{arch}" is replaced (x86_64, arm64).
	AgentKernel string `json:"agent_kernel"`
	AgentInitrd string `json:"agent_initrd"`
	// Retries bounds DHCP, probe and download attempts in the scripts.
	Retries int `json:"retries"`
	// AssetWait is how long a machine whose boot assets are not at the site yet waits before asking again.
	AssetWait time.Duration `json:"asset_wait"`
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are the http.Server timeouts.
	ReadHeaderTimeout time.Duration `json:"read_header_timeout"`
	ReadTimeout       time.Duration `json:"read_timeout"`
	WriteTimeout      time.Duration `json:"write_timeout"`
	IdleTimeout       time.Duration `json:"idle_timeout"`
	// MaxConns bounds the open connections, MaxConnsPerSource those from one client address (see
	// LimitListener). At a bound, the oldest connection that never got a response byte (a client still
	// sending its headers, as slowloris does for ReadHeaderTimeout at most) or is idle between requests is
	// closed to make room; when there is none, the new connection is reset at once.
	MaxConns          int `json:"max_conns"`
	MaxConnsPerSource int `json:"max_conns_per_source"`
}

// Default returns the production defaults.
func Default() Config {
	return Config{
		Listen:            ":80",
		AssetsDir:         "/var/lib/outpost-edge/assets",
		AgentPort:         50042,
		KernelArgs:        []string{"console=tty0", "console=ttyS0"},
		AgentKernel:       "/assets/agent/{arch}/vmlinuz",
		AgentInitrd:       "/assets/agent/{arch}/initramfs.xz",
		Retries:           5,
		AssetWait:         30 * time.Second,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		// A booting machine holds one connection (iPXE fetches kernel and initrd one after the other on it),
		// two at most, for as long as its downloads take: 5,000 lets thousands of machines boot at once and
		// keeps connections (with the asset file each download opens) well inside a 20,000 open-files limit.
		MaxConns:          5000,
		MaxConnsPerSource: 32,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	if c.Listen == "" || c.AssetsDir == "" {
		errs = append(errs, errors.New("listen and assets_dir are required"))
	}

	if c.AdvertiseHost != "" && !hostRE.MatchString(c.AdvertiseHost) {
		errs = append(errs, fmt.Errorf("advertise_host %q is not host[:port]", c.AdvertiseHost))
	}

	if c.AgentAddress == "" && (c.AgentPort <= 0 || c.AgentPort > 65535) {
		errs = append(errs, fmt.Errorf("agent_port %d out of range", c.AgentPort))
	}

	if c.Retries <= 0 {
		errs = append(errs, errors.New("retries must be positive"))
	}

	if c.AssetWait < time.Second {
		errs = append(errs, fmt.Errorf("asset_wait %s: at least 1s", c.AssetWait))
	}

	if c.ReadHeaderTimeout <= 0 || c.ReadTimeout <= 0 || c.WriteTimeout <= 0 || c.IdleTimeout <= 0 {
		errs = append(errs, errors.New("all timeouts must be positive"))
	}

	if c.MaxConns <= 0 || c.MaxConnsPerSource <= 0 || c.MaxConnsPerSource > c.MaxConns {
		errs = append(errs, fmt.Errorf("max_conns %d and max_conns_per_source %d: both positive, per source at most the total",
			c.MaxConns, c.MaxConnsPerSource))
	}

	return errors.Join(errs...)
}

// Table is the boot table as the server reads it (edge/boot.Table).
type Table interface {
	Lookup(uuid string, mac net.HardwareAddr, arch string) boot.Entry
	MachineConfig(uuid string) []byte
}

// BootServed describes an answered boot.ipxe, for the event journal.
type BootServed struct {
	UUID         string
	MAC          net.HardwareAddr
	Arch         string
	Platform     string
	Mode         string
	Remote       netip.Addr
	TableVersion uint64
}

// Observer is told about served boot scripts and binaries (after the response has been flushed).
type Observer interface {
	BootServed(BootServed)
	HTTPFetch(tftp.Fetch)
}

// ConfigObserver is told when a machine fetched its config (/config?u=<uuid>): the booted system itself asks,
// from the address its agent will dial from. An Observer may implement it.
type ConfigObserver interface {
	ConfigServed(uuid string, remote netip.Addr)
}

// Deps are the server's collaborators. Table and Catalog are required.
type Deps struct {
	Table   Table
	Catalog *tftp.Catalog
	// Assets tells whether the asset cache holds a name under /assets/ (optional; files in AssetsDir count
	// too). A boot whose edge-local kernel or initrd is in neither gets a script that waits for them.
	Assets AssetIndex
	// Observer is optional.
	Observer Observer
	// Registerer receives this server's metrics; Gatherer is what /metrics serves (usually the same registry).
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// AssetIndex is the edge's asset cache as the boot scripts see it.
type AssetIndex interface {
	// Has reports whether the cache holds the asset served at /assets/<name>.
	Has(name string) bool
}

// Server is the edge's HTTP server.
type Server struct {
	cfg  Config
	log  *zap.Logger
	deps Deps
	root *os.Root

	requests *prometheus.CounterVec
	rejected *prometheus.CounterVec
	served   *prometheus.CounterVec

	// waits remembers which waiting machines were reported lately.
	waits waitReports

	conns   *limits.Limiter
	rejects *limits.RejectLog

	handler http.Handler
}

// hostRE matches host[:port] with an IPv4, IPv6 or DNS host: nothing that could break out of a script line.
var hostRE = regexp.MustCompile(`^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$`)

// New builds the server; the assets directory is created when missing.
func New(cfg Config, logger *zap.Logger, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("http config: %w", err)
	}

	if deps.Table == nil || deps.Catalog == nil {
		return nil, errors.New("http server needs a boot table and a catalog")
	}

	if err := os.MkdirAll(cfg.AssetsDir, 0o755); err != nil {
		return nil, fmt.Errorf("create assets dir: %w", err)
	}

	root, err := os.OpenRoot(cfg.AssetsDir)
	if err != nil {
		return nil, fmt.Errorf("open assets dir: %w", err)
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
		cfg: cfg, log: log, deps: deps, root: root,
		conns:   limits.New(limits.Config{Total: cfg.MaxConns, PerSource: cfg.MaxConnsPerSource}),
		rejects: limits.NewRejectLog(log, "http connection refused", limits.DefaultLogInterval, nil),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_http_requests_total", Help: "HTTP requests, by handler and status code.",
		}, []string{"handler", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_http_rejected_total", Help: "HTTP requests refused for bad input, by reason.",
		}, []string{"reason"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_ipxe_boot_served_total", Help: "boot.ipxe answers, by boot mode.",
		}, []string{"mode"}),
	}

	for _, c := range []prometheus.Collector{s.requests, s.rejected, s.served, s.conns.Collector("outpost_http_connections", "HTTP connections")} {
		if err := deps.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register http metrics: %w", err)
		}
	}

	mux := http.NewServeMux()
	mux.Handle("GET /ipxe/init.ipxe", s.count("init", http.HandlerFunc(s.serveInit)))
	mux.Handle("GET /ipxe/probe.ipxe", s.count("probe", http.HandlerFunc(s.serveProbe)))
	mux.Handle("GET /ipxe/boot.ipxe", s.count("boot", http.HandlerFunc(s.serveBoot)))
	mux.Handle("GET /tftp/{file...}", s.count("tftp", http.HandlerFunc(s.serveBinary)))
	mux.Handle("GET /assets/{path...}", s.count("assets", http.HandlerFunc(s.serveAsset)))
	mux.Handle("GET /config", s.count("config", http.HandlerFunc(s.serveConfig)))
	mux.Handle("GET /metrics", s.count("metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{})))
	mux.Handle("GET /healthz", s.count("healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, "text/plain; charset=utf-8", []byte("ok\n"))
	})))
	s.handler = mux

	return s, nil
}

// Handler returns the server's routes (for tests and for mounting elsewhere).
func (s *Server) Handler() http.Handler {
	return s.handler
}

// Close releases the assets directory handle and writes the pending refusal counts.
func (s *Server) Close() error {
	s.rejects.Flush()

	return s.root.Close()
}

// LimitListener wraps ln so that its connections count against MaxConns and MaxConnsPerSource: a connection
// over a bound is reset at once (counted in outpost_http_connections_refused_total, logged once per reason per
// interval). Every http.Server on it should set ConnState to limits.ConnState, so idle keep-alive connections
// can make room too. Serve does both; the edge's composition root serves its own handler on it.
func (s *Server) LimitListener(ln net.Listener) net.Listener {
	return limits.NewListener(ln, s.conns, s.rejects, map[limits.Reason]string{
		limits.PerSource: fmt.Sprintf("this address already holds %d connections, all busy (--http-max-conns-per-source)", s.cfg.MaxConnsPerSource),
		limits.Total:     fmt.Sprintf("%d connections open, all busy (--http-max-conns); raise it if real machines are refused", s.cfg.MaxConns),
	})
}

// ConnStats returns the connection limiter's counts.
func (s *Server) ConnStats() limits.Stats { return s.conns.Stats() }

// Run listens on cfg.Listen and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var lc net.ListenConfig

	ln, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen http on %s: %w", s.cfg.Listen, err)
	}

	return s.Serve(ctx, ln)
}

// Serve serves on ln, within the connection bounds (LimitListener), until ctx ends, then shuts down
// gracefully (bounded to 5 s). It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ln = s.LimitListener(ln)

	srv := &http.Server{
		ConnState:         limits.ConnState,
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(s.log),
	}

	errc := make(chan error, 1)

	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		if err := srv.Shutdown(shutdownCtx); err != nil {
			srv.Close() //nolint:errcheck,gosec
		}

		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}

		return nil
	}
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}

	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}

	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// ReadFrom keeps the underlying writer's sendfile path for asset bodies.
func (r *statusRecorder) ReadFrom(src io.Reader) (int64, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}

	if rf, ok := r.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}

	return io.Copy(struct{ io.Writer }{r.ResponseWriter}, src)
}

func (s *Server) count(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)

		if rec.code == 0 {
			rec.code = http.StatusOK
		}

		s.requests.WithLabelValues(name, strconv.Itoa(rec.code)).Inc()
	})
}

// writeText sends a complete small response with Content-Length and flushes it, so the client has it
// before the handler does anything else.
func writeText(w http.ResponseWriter, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)                      //nolint:errcheck // the client went away: nothing to do
	_ = http.NewResponseController(w).Flush() //nolint:errcheck
}

func (s *Server) reject(w http.ResponseWriter, reason string, code int, err error) {
	s.rejected.WithLabelValues(reason).Inc()
	s.log.Debug("http request refused", zap.String("reason", reason), zap.Error(err))
	http.Error(w, http.StatusText(code), code)
}

// base returns "http://host[:port]" as machines reach this server.
func (s *Server) base(r *http.Request) (string, bool) {
	if s.cfg.AdvertiseHost != "" {
		return "http://" + s.cfg.AdvertiseHost, true
	}

	if !hostRE.MatchString(r.Host) {
		return "", false
	}

	return "http://" + r.Host, true
}

func (s *Server) agentAddress(r *http.Request) string {
	if s.cfg.AgentAddress != "" {
		return s.cfg.AgentAddress
	}

	host := s.cfg.AdvertiseHost
	if host == "" {
		host = r.Host
	}

	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}

	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(s.cfg.AgentPort))
}

func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}

	return ap.Addr().Unmap()
}

func (s *Server) serveInit(w http.ResponseWriter, r *http.Request) {
	base, ok := s.base(r)
	if !ok {
		s.reject(w, "bad_host", http.StatusBadRequest, nil)

		return
	}

	writeText(w, "text/plain; charset=utf-8", renderInit(base, s.cfg.Retries))
}

func (s *Server) serveProbe(w http.ResponseWriter, _ *http.Request) {
	writeText(w, "text/plain; charset=utf-8", []byte(probeScript))
}

func (s *Server) serveBoot(w http.ResponseWriter, r *http.Request) {
	q, err := ParseBootQuery(r.URL.RawQuery)
	if err != nil {
		s.reject(w, "bad_query", http.StatusBadRequest, err)

		return
	}

	base, ok := s.base(r)
	if !ok {
		s.reject(w, "bad_host", http.StatusBadRequest, nil)

		return
	}

	e := s.deps.Table.Lookup(q.UUID, q.MAC, q.KernelArch())
	script, mode, report := s.bootScript(e, q, base, s.agentAddress(r))

	if script == nil {
		// Deny, or disk by HTTP 404: the chain fails and the firmware moves on.
		http.Error(w, "no boot for this machine", http.StatusNotFound)
	} else {
		writeText(w, "text/plain; charset=utf-8", script)
	}

	s.served.WithLabelValues(mode).Inc()

	if s.deps.Observer != nil && report {
		s.deps.Observer.BootServed(BootServed{
			UUID: q.UUID, MAC: q.MAC, Arch: q.Arch, Platform: q.Platform, Mode: mode, Remote: remoteAddr(r), TableVersion: e.Version,
		})
	}
}

// bootScript renders the answer for an entry (nil means answer 404), its mode, and whether to report it
// (every boot but the repeats of a machine waiting for assets).
func (s *Server) bootScript(e boot.Entry, q BootQuery, base, agentAddr string) ([]byte, string, bool) {
	args := e.KernelArgs
	if len(args) == 0 {
		args = s.cfg.KernelArgs
	}

	args = append(append([]string(nil), args...), e.ExtraArgs...)

	switch e.Mode {
	case bootpb.Mode_MODE_DENY:
		return nil, "deny", true
	case bootpb.Mode_MODE_DISK:
		switch e.DiskMethod {
		case bootpb.DiskMethod_DISK_METHOD_HTTP_404:
			return nil, "disk", true
		case bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT:
			return []byte(sanbootScript), "disk", true
		default:
			return []byte(exitScript), "disk", true
		}
	case bootpb.Mode_MODE_INSTALL:
		if missing := s.missing(e.Install); len(missing) > 0 {
			script, report := s.wait("install", e.UUID, q, base, missing)

			return script, "wait", report
		}

		// The installed Talos fetches its join config from this edge once, then reaches Omni over SideroLink.
		all := withDefaultArgs(append(append([]string(nil), e.Install.GetArgs()...), args...),
			"talos.config="+base+"/config?u=${uuid}")

		return renderKernel("install "+e.UUID, absolute(base, e.Install), all, s.cfg.Retries), "install", true
	default:
		k := e.Agent
		if k.GetKernelUrl() == "" {
			arch := q.KernelArch()
			k = &bootpb.Kernel{
				KernelUrl: strings.ReplaceAll(s.cfg.AgentKernel, "{arch}", arch),
				InitrdUrl: strings.ReplaceAll(s.cfg.AgentInitrd, "{arch}", arch),
			}
		}

		if missing := s.missing(k); len(missing) > 0 {
			script, report := s.wait("agent", e.UUID, q, base, missing)

			return script, "wait", report
		}

		all := withDefaultArgs(append(append([]string(nil), k.GetArgs()...), args...),
			"metal.provider.address="+agentAddr, "talos.config="+base+"/config?u=${uuid}")

		return renderKernel("agent mode", absolute(base, k), all, s.cfg.Retries), "agent", true
	}
}

// withDefaultArgs puts each key=value default in front of args unless args already set that key (the
// controller named an address of its own); an argument given twice (the edge's and the plan's console) is
// kept once.
func withDefaultArgs(args []string, defaults ...string) []string {
	var front []string

	for _, d := range defaults {
		key, _, _ := strings.Cut(d, "=")
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, key+"=") }) {
			front = append(front, d)
		}
	}

	out := make([]string, 0, len(front)+len(args))

	for _, a := range append(front, args...) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}

	return out
}

// missing returns the edge-local (/assets/...) kernel and initrd of k that the edge cannot serve now: neither
// in the asset cache nor a file in the assets directory. URLs elsewhere (the image factory) are not checked.
func (s *Server) missing(k *bootpb.Kernel) []string {
	var out []string

	for _, u := range []string{k.GetKernelUrl(), k.GetInitrdUrl()} {
		name, ok := strings.CutPrefix(u, "/assets/")
		if !ok || name == "" {
			continue
		}

		if s.deps.Assets != nil && s.deps.Assets.Has(name) {
			continue
		}

		if st, err := s.root.Stat(name); err == nil && st.Mode().IsRegular() {
			continue
		}

		out = append(out, name)
	}

	return out
}

// wait answers a boot whose assets have not reached the site: the machine waits in iPXE and asks again. A
// waiting machine is logged (and its boot reported, report) once per waitReportEvery, not at every retry.
func (s *Server) wait(mode, uuid string, q BootQuery, base string, missing []string) (script []byte, report bool) {
	report = s.waits.first(q.UUID+"|"+q.MAC.String(), time.Now())
	if report {
		s.log.Warn("boot waits for assets the site does not hold", zap.String("mode", mode), zap.String("uuid", uuid),
			zap.Strings("missing", missing))
	}

	return renderWait(mode, len(missing), base+"/ipxe/boot.ipxe?"+q.Encode(), int(s.cfg.AssetWait.Seconds())), report
}

// waitReportEvery is how often a machine that keeps waiting for assets is logged and reported.
const waitReportEvery = 10 * time.Minute

// waitReports remembers when each waiting machine was last reported (bounded: old entries go first).
type waitReports struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// first reports whether key is due a report at now, and records it when so.
func (w *waitReports) first(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()

	if t, ok := w.last[key]; ok && now.Sub(t) < waitReportEvery {
		return false
	}

	if w.last == nil || len(w.last) >= 4096 {
		for k, t := range w.last {
			if now.Sub(t) >= waitReportEvery {
				delete(w.last, k)
			}
		}

		if w.last == nil || len(w.last) >= 4096 {
			w.last = map[string]time.Time{}
		}
	}

	w.last[key] = now

	return true
}

// absolute makes edge-relative kernel and initrd paths absolute URLs.
func absolute(base string, k *bootpb.Kernel) *bootpb.Kernel {
	abs := func(u string) string {
		if strings.HasPrefix(u, "/") {
			return base + u
		}

		return u
	}

	return &bootpb.Kernel{KernelUrl: abs(k.GetKernelUrl()), InitrdUrl: abs(k.GetInitrdUrl()), Args: k.GetArgs()}
}

func (s *Server) serveBinary(w http.ResponseWriter, r *http.Request) {
	f, err := s.deps.Catalog.Lookup(r.PathValue("file"))
	if err != nil {
		reason := "not_found"
		if errors.Is(err, tftp.ErrBadName) {
			reason = "bad_name"
		}

		s.reject(w, reason, http.StatusNotFound, err)

		return
	}

	w.Header().Set("ETag", `"`+f.SHA256+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, f.Name, f.ModTime, f.Reader())

	if s.deps.Observer != nil && r.Method == http.MethodGet {
		s.deps.Observer.HTTPFetch(tftp.Fetch{Name: f.Name, Remote: remoteAddr(r)})
	}
}

func (s *Server) serveAsset(w http.ResponseWriter, r *http.Request) {
	name := path.Clean(r.PathValue("path"))
	if name == "." || strings.HasPrefix(name, "..") || strings.HasPrefix(name, "/") {
		s.reject(w, "bad_path", http.StatusNotFound, nil)

		return
	}

	f, err := s.root.Open(name)
	if err != nil {
		s.reject(w, "not_found", http.StatusNotFound, err)

		return
	}
	defer f.Close() //nolint:errcheck

	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		s.reject(w, "not_found", http.StatusNotFound, err)

		return
	}

	w.Header().Set("ETag", fmt.Sprintf(`"%x-%x"`, st.Size(), st.ModTime().UnixNano()))
	w.Header().Set("Content-Type", "application/octet-stream")
	// ServeContent handles Range, HEAD and conditional requests; with an *os.File the body goes out via sendfile.
	http.ServeContent(w, r, st.Name(), st.ModTime(), f)
}

func (s *Server) serveConfig(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("u")
	if len(u) > 64 {
		s.reject(w, "bad_query", http.StatusBadRequest, nil)

		return
	}

	cfg := s.deps.Table.MachineConfig(u)
	if cfg == nil {
		http.Error(w, "no machine config from the controller yet", http.StatusServiceUnavailable)

		return
	}

	writeText(w, "application/yaml", cfg)

	if obs, ok := s.deps.Observer.(ConfigObserver); ok && uuidRE.MatchString(strings.ToLower(u)) {
		obs.ConfigServed(strings.ToLower(u), remoteAddr(r))
	}
}
