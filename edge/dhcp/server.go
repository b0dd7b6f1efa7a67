package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
)

// ErrNothingBootable is returned by New when no firmware class has its boot file available.
var ErrNothingBootable = errors.New("no firmware class is bootable")

// Config configures the ProxyDHCP server.
type Config struct {
	// Interface is the network interface to serve (SO_BINDTODEVICE); empty binds to none (tests only).
	Interface string
	// ServerIP is the edge's address on that network; empty means the interface's first IPv4 address.
	ServerIP string
	// HTTPPort is the port of the edge's HTTP server.
	HTTPPort int
	// Port and PXEPort are the listening ports (67 and 4011).
	Port    int
	PXEPort int
	// Files names the iPXE binaries per firmware class.
	Files BootFiles
	// Workers is the number of goroutines deciding and answering requests.
	Workers int
	// QueueSize bounds the requests waiting for a worker; beyond it requests are dropped.
	QueueSize int
	// ReadBuffer is the sockets' kernel receive buffer in bytes (absorbs bursts before the queue).
	ReadBuffer int
	// RatePerMAC and RateBurst limit requests per client MAC (a token bucket per MAC).
	RatePerMAC float64
	RateBurst  int
	// MaxTrackedMACs bounds the per-MAC state; when full it is reset.
	MaxTrackedMACs int
	// ClientPort and RelayPort are where replies go (68 and 67); only tests change them.
	ClientPort int
	RelayPort  int
	// Discovery is who is answered: all, known (machines in the boot table) or off.
	Discovery Discovery
	// Mode is full (67 and 4011) or 4011-only (beside a site DHCP server that offers PXE).
	Mode Mode
	// ProbeTimeout bounds the wait for an answer to the probe of an address before it is offered (full DHCP).
	ProbeTimeout time.Duration
	// GuardInterval is how often, while full DHCP mode is asked for, the segment is checked for another DHCP
	// server (it is also checked before full mode first serves).
	GuardInterval time.Duration
	// MaxProbes is how many DISCOVERs may wait for their address probes at once (full DHCP); beyond it the
	// workers answer them, one probe at a time each.
	MaxProbes int
	// Leases bound what clients can make full DHCP mode hold.
	Leases LeaseLimits
}

// Default returns the production defaults.
func Default() Config {
	return Config{
		HTTPPort:       80,
		Port:           ServerPort,
		PXEPort:        PXEPort,
		Files:          DefaultBootFiles(),
		Workers:        4,
		QueueSize:      1024,
		ReadBuffer:     4 << 20,
		RatePerMAC:     5,
		RateBurst:      10,
		MaxTrackedMACs: 65536,
		ClientPort:     ClientPort,
		RelayPort:      ServerPort,
		Discovery:      DiscoverAll,
		Mode:           ModeFull,
		ProbeTimeout:   300 * time.Millisecond,
		MaxProbes:      256,
		GuardInterval:  2 * time.Minute,
		Leases:         DefaultLeaseLimits(),
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	switch c.Discovery {
	case DiscoverAll, DiscoverKnown, DiscoverOff, "":
	default:
		errs = append(errs, fmt.Errorf("discovery %q: want all, known or off", c.Discovery))
	}

	switch c.Mode {
	case ModeFull, Mode4011Only, "":
	default:
		errs = append(errs, fmt.Errorf("proxydhcp mode %q: want full or 4011-only", c.Mode))
	}

	if c.ServerIP == "" && c.Interface == "" {
		errs = append(errs, errors.New("server_ip or interface is required"))
	}

	if c.ServerIP != "" {
		if a, err := netip.ParseAddr(c.ServerIP); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("server_ip %q is not an IPv4 address", c.ServerIP))
		}
	}

	for name, p := range map[string]int{
		"HTTP port (of --http-listen)": c.HTTPPort, "DHCP port": c.Port, "PXE port": c.PXEPort, "client port": c.ClientPort, "relay port": c.RelayPort,
	} {
		if p <= 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s %d out of range", name, p))
		}
	}

	if c.ReadBuffer < 0 {
		errs = append(errs, errors.New("the read buffer must not be negative"))
	}

	if c.Workers <= 0 || c.QueueSize <= 0 || c.RatePerMAC <= 0 || c.RateBurst <= 0 || c.MaxTrackedMACs <= 0 {
		errs = append(errs, errors.New("workers, queue size, rate and burst per MAC and tracked MACs must be positive"))
	}

	if c.ProbeTimeout <= 0 || c.MaxProbes <= 0 || c.GuardInterval <= 0 || c.Leases.OfferTTL <= 0 || c.Leases.MaxOffers <= 0 || c.Leases.DeclineHold <= 0 || c.Leases.MaxBad <= 0 {
		errs = append(errs, errors.New("the probe timeout, probes at once, guard interval, offer lifetime, pending offers, decline hold and held-back addresses must be positive"))
	}

	if len(c.Files.Names()) == 0 {
		errs = append(errs, errors.New("no boot files configured"))
	}

	return errors.Join(errs...)
}

// Seen describes a PXE client the server answered, for the event journal.
type Seen struct {
	MAC      net.HardwareAddr
	Firmware Firmware
	IPXE     bool
	// UUID is from option 97 when the client sent it.
	UUID string
	Role Role
	// Relay is the relay agent's address (giaddr) when relayed.
	Relay netip.Addr
	// NotAnswered is why the machine was offered nothing ("" when it was answered; see machineDrops).
	NotAnswered DropReason
}

// machineDrops are the reasons a classified machine is offered nothing that its timeline shows: what it is
// refused is its own (its firmware, its Secure Boot, its plan), not the request's or the server's.
var machineDrops = map[DropReason]bool{
	DropNotBootable: true, DropNoSignedFile: true, DropSecureBootDisk: true, DropSignedNotHeld: true, DropSignedNeedsHTTP: true,
}

// Observer is told about answered clients, and machines offered nothing for a reason of their own (once per
// client and class per minute).
type Observer interface {
	DHCPSeen(Seen)
}

// Deps are the server's collaborators; all are optional.
type Deps struct {
	// Bootable reports whether a boot file is served (the TFTP catalog); nil means all are.
	Bootable func(name string) bool
	// Held reports whether the edge holds an asset (the asset cache); nil: none.
	Held func(name string) bool
	// Upstream reports whether the site's machines may fetch assets upstream (passthrough); nil: never.
	Upstream func() bool
	// Prefs gives per-machine choices (the boot table).
	Prefs Preferences
	// Observer receives client sightings.
	Observer Observer
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Now is the clock (rate limits, event de-duplication, leases).
	Now func() time.Time
	// Site gives the site's DHCP service (the boot table); nil: proxy.
	Site SiteDHCP
	// Leases holds full DHCP mode's leases; nil: full mode is refused (answered as proxy).
	Leases *LeaseStore
	// Probe checks an address before it is offered; nil: not probed.
	Probe Prober
	// Guard keeps full mode off a segment with another DHCP server; nil: no guard (tests only).
	Guard *Guard
}

// Server is the ProxyDHCP server.
type Server struct {
	cfg    Config
	params Params
	log    *zap.Logger
	deps   Deps

	requests *prometheus.CounterVec
	replies  *prometheus.CounterVec
	drops    *prometheus.CounterVec

	// full DHCP mode
	pool         atomic.Pointer[poolState]
	naks         *prometheus.CounterVec
	leaseReplies *prometheus.CounterVec
	probeErrors  prometheus.Counter
	conflicts    prometheus.Counter
	// probeSlots bounds the DISCOVERs answered after a probe at once (a token per goroutine); probing
	// counts them, and Serve waits for them before it returns.
	probeSlots chan struct{}
	probing    sync.WaitGroup
	// exhausted paces the warning that the pool is exhausted (once a minute at most).
	exhausted rate.Sometimes

	mu   sync.Mutex
	macs map[[6]byte]*macState
}

type macState struct {
	limiter  *rate.Limiter
	lastKey  string
	lastSeen time.Time
}

// seenInterval is how often the same client and class is reported to the observer.
const seenInterval = time.Minute

// New validates cfg, reports which firmware classes are bootable and builds the server.
// It returns ErrNothingBootable when none is.
func New(cfg Config, logger *zap.Logger, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dhcp config: %w", err)
	}

	serverIP, err := resolveServerIP(cfg)
	if err != nil {
		return nil, err
	}

	if deps.Now == nil {
		deps.Now = time.Now
	}

	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}

	s := &Server{
		cfg:        cfg,
		log:        logger.With(zap.String("component", "dhcp")),
		deps:       deps,
		probeSlots: make(chan struct{}, cfg.MaxProbes),
		exhausted:  rate.Sometimes{Interval: time.Minute},
		params: Params{
			ServerIP: serverIP,
			HTTPPort: cfg.HTTPPort,
			Files:    cfg.Files,
			Bootable: deps.Bootable,
			Held:     deps.Held,
			Upstream: deps.Upstream,
			Prefs:    deps.Prefs,

			Discovery: cfg.Discovery,
			Mode:      cfg.Mode,

			ClientPort: cfg.ClientPort,
			RelayPort:  cfg.RelayPort,
		},
		macs: map[[6]byte]*macState{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_dhcp_requests_total", Help: "ProxyDHCP requests received, by port role.",
		}, []string{"role"}),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_dhcp_replies_total", Help: "ProxyDHCP replies sent, by port role and firmware class.",
		}, []string{"role", "firmware"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_dhcp_dropped_total", Help: "ProxyDHCP requests dropped, by reason.",
		}, []string{"reason"}),
	}

	s.naks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outpost_dhcp_naks_total", Help: "DHCPNAKs sent in full DHCP mode, by reason.",
	}, []string{"reason"})
	s.leaseReplies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outpost_dhcp_lease_replies_total", Help: "Replies sent in full DHCP mode, by message type (OFFER, ACK, NAK).",
	}, []string{"type"})
	s.probeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outpost_dhcp_probe_errors_total", Help: "Address probes that could not be made (the address was offered unprobed).",
	})
	s.conflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outpost_dhcp_probe_conflicts_total", Help: "Pool addresses a probe found in use by another host (held back).",
	})
	leases := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outpost_dhcp_leases", Help: "Live leases in full DHCP mode.",
	}, func() float64 { b, _, _ := s.leaseCounts(); return float64(b) })
	offers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outpost_dhcp_offers_pending", Help: "Offers in full DHCP mode not yet requested (each holds its address until it expires).",
	}, func() float64 { _, o, _ := s.leaseCounts(); return float64(o) })
	heldBack := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outpost_dhcp_addresses_held_back", Help: "Pool addresses held back in full DHCP mode after a DECLINE or a probe that found them in use.",
	}, func() float64 { _, _, b := s.leaseCounts(); return float64(b) })
	poolFree := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outpost_dhcp_pool_size", Help: "Addresses in the full DHCP mode pool (0 when the edge does not serve full mode).",
	}, func() float64 {
		if st := s.pool.Load(); st != nil && st.pool != nil {
			return float64(st.pool.Size())
		}

		return 0
	})

	for _, c := range []prometheus.Collector{s.requests, s.replies, s.drops, s.naks, s.leaseReplies, s.probeErrors, s.conflicts, leases, offers, heldBack, poolFree} {
		if err := deps.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register dhcp metrics: %w", err)
		}
	}

	bootable := s.BootableFirmware()
	if len(bootable) == 0 {
		return nil, fmt.Errorf("dhcp boot files %v: %w", cfg.Files.Names(), ErrNothingBootable)
	}

	names := make([]string, 0, len(bootable))
	for _, f := range bootable {
		names = append(names, f.String())
	}

	s.log.Info("proxydhcp ready", zap.Strings("bootable_firmware", names), zap.Stringer("server_ip", serverIP))

	return s, nil
}

// Params returns the decision parameters the server uses (for contract tests).
func (s *Server) Params() Params {
	return s.params
}

// BootableFirmware lists the firmware classes whose boot file is available.
func (s *Server) BootableFirmware() []Firmware {
	var out []Firmware

	for _, f := range AllFirmware {
		name := s.cfg.Files.File(f, false)
		if name != "" && (s.deps.Bootable == nil || s.deps.Bootable(name)) {
			out = append(out, f)
		}
	}

	return out
}

func resolveServerIP(cfg Config) (netip.Addr, error) {
	if cfg.ServerIP != "" {
		return netip.MustParseAddr(cfg.ServerIP), nil // validated above
	}

	iface, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("look up interface %q: %w", cfg.Interface, err)
	}

	addrs, err := iface.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list addresses of %q: %w", cfg.Interface, err)
	}

	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().Is4() {
			return pfx.Addr(), nil
		}
	}

	return netip.Addr{}, fmt.Errorf("interface %q has no IPv4 address", cfg.Interface)
}

type job struct {
	buf  *[]byte
	n    int
	peer netip.AddrPort
	role Role
	conn net.PacketConn
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 1500); return &b }}

// Serve answers requests arriving on dhcpConn (port 67 role) and pxeConn (port 4011 role) until ctx ends;
// it returns nil on cancellation. The caller owns the connections; pxeConn may be nil.
func (s *Server) Serve(ctx context.Context, dhcpConn, pxeConn net.PacketConn) error {
	jobs := make(chan job, s.cfg.QueueSize)

	eg, ctx := errgroup.WithContext(ctx)

	for range s.cfg.Workers {
		eg.Go(func() error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case j := <-jobs:
					s.handle(ctx, j)
				}
			}
		})
	}

	for role, conn := range map[Role]net.PacketConn{RoleDHCP: dhcpConn, RolePXE: pxeConn} {
		if conn == nil {
			continue
		}

		eg.Go(func() error { return s.read(ctx, conn, role, jobs) })
	}

	eg.Go(func() error {
		<-ctx.Done()
		// Unblock the readers; the caller still owns and closes the connections.
		for _, c := range []net.PacketConn{dhcpConn, pxeConn} {
			if c != nil {
				_ = c.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck
			}
		}

		return nil
	})

	err := eg.Wait()

	s.probing.Wait() // the answers after a probe end with ctx; they write on connections the caller still holds

	return err
}

func (s *Server) read(ctx context.Context, conn net.PacketConn, role Role, jobs chan<- job) error {
	for {
		buf := bufPool.Get().(*[]byte)

		n, addr, err := conn.ReadFrom(*buf)
		if err != nil {
			bufPool.Put(buf)

			if ctx.Err() != nil {
				return nil
			}

			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}

			return fmt.Errorf("read %s port: %w", role, err)
		}

		s.requests.WithLabelValues(role.String()).Inc()

		var peer netip.AddrPort
		if ua, ok := addr.(*net.UDPAddr); ok {
			peer = ua.AddrPort()
			peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
		}

		select {
		case jobs <- job{buf: buf, n: n, peer: peer, role: role, conn: conn}:
		default:
			bufPool.Put(buf)
			s.drop(DropQueueFull, nil, peer, nil)
		}
	}
}

func (s *Server) handle(ctx context.Context, j job) {
	defer bufPool.Put(j.buf)

	raw := (*j.buf)[:j.n]

	// Rate-limit on the raw chaddr before parsing, so a junk flood from one MAC costs little.
	mac, hasMAC := rawMAC(raw)
	if hasMAC && !s.allow(mac) {
		s.drop(DropRateLimited, nil, j.peer, nil)

		return
	}

	switch svc, pool := s.service(); {
	case svc == ServeOff:
		s.drop(DropDHCPOff, nil, j.peer, nil)

		return
	case svc == ServeFull && pool != nil && s.deps.Leases != nil && j.role == RoleDHCP:
		if s.deps.Guard != nil && !s.deps.Guard.Clear() {
			s.deps.Guard.Kick() // not checked yet, or another server answers: proxy answers meanwhile
		} else if s.handleFull(ctx, j, raw, pool) {
			return
		}
	}

	p := s.params
	d := Decide(p, j.role, j.peer, raw)

	if d.Reply == nil {
		s.drop(d.Drop, d.Err, j.peer, d.MAC)

		if s.deps.Observer != nil && hasMAC && machineDrops[d.Drop] && s.shouldReport(mac, d) {
			s.deps.Observer.DHCPSeen(Seen{MAC: d.MAC, Firmware: d.Firmware, IPXE: d.IPXE, UUID: d.UUID, Role: j.role, NotAnswered: d.Drop})
		}

		return
	}

	if _, err := j.conn.WriteTo(d.Reply.ToBytes(), net.UDPAddrFromAddrPort(d.Dest)); err != nil {
		s.drop(DropWriteFailed, err, j.peer, d.MAC)

		return
	}

	s.replies.WithLabelValues(j.role.String(), d.Firmware.String()).Inc()

	if ce := s.log.Check(zap.DebugLevel, "proxydhcp reply"); ce != nil {
		ce.Write(zap.Stringer("mac", d.MAC), zap.Stringer("firmware", d.Firmware), zap.Bool("ipxe", d.IPXE),
			zap.String("boot_file", d.BootFile), zap.Stringer("dest", d.Dest), zap.Stringer("role", j.role))
	}

	if s.deps.Observer != nil && hasMAC && s.shouldReport(mac, d) {
		relay, _ := netip.AddrFromSlice(d.Reply.GatewayIPAddr.To4())
		if relay.IsUnspecified() {
			relay = netip.Addr{}
		}

		s.deps.Observer.DHCPSeen(Seen{MAC: d.MAC, Firmware: d.Firmware, IPXE: d.IPXE, UUID: d.UUID, Role: j.role, Relay: relay})
	}
}

// drop counts a request not answered and logs it (at debug: a flood must not flood the log); mac is the
// client's when the request was read that far.
func (s *Server) drop(reason DropReason, err error, peer netip.AddrPort, mac net.HardwareAddr) {
	s.drops.WithLabelValues(string(reason)).Inc()

	if ce := s.log.Check(zap.DebugLevel, "proxydhcp drop"); ce != nil {
		ce.Write(zap.String("reason", string(reason)), zap.Error(err), zap.Stringer("peer", peer), zap.Stringer("mac", mac))
	}
}

// leaseCounts counts full mode's leases (zero without a lease store).
func (s *Server) leaseCounts() (bound, offered, bad int) {
	if s.deps.Leases == nil {
		return 0, 0, 0
	}

	now := s.deps.Now()
	_ = s.deps.Leases.Do(func(st *LeaseState) bool { bound, offered, bad = st.Counts(now); return false }) //nolint:errcheck // nothing persisted

	return bound, offered, bad
}

// rawMAC reads an Ethernet chaddr straight from the BOOTP header (RFC 2131 §2: htype at 1, hlen at 2, chaddr at 28).
func rawMAC(raw []byte) ([6]byte, bool) {
	var mac [6]byte
	if len(raw) < 34 || raw[1] != 1 || raw[2] != 6 {
		return mac, false
	}

	copy(mac[:], raw[28:34])

	return mac, true
}

func (s *Server) state(mac [6]byte) *macState {
	st, ok := s.macs[mac]
	if !ok {
		if len(s.macs) >= s.cfg.MaxTrackedMACs {
			clear(s.macs)
		}

		st = &macState{limiter: rate.NewLimiter(rate.Limit(s.cfg.RatePerMAC), s.cfg.RateBurst)}
		s.macs[mac] = st
	}

	return st
}

func (s *Server) allow(mac [6]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.state(mac).limiter.AllowN(s.deps.Now(), 1)
}

func (s *Server) shouldReport(mac [6]byte, d Decision) bool {
	key := fmt.Sprintf("%s/%t/%s/%s", d.Firmware, d.IPXE, d.UUID, d.Drop)
	now := s.deps.Now()

	s.mu.Lock()
	defer s.mu.Unlock()

	st := s.state(mac)
	if st.lastKey == key && now.Sub(st.lastSeen) < seenInterval {
		return false
	}

	st.lastKey, st.lastSeen = key, now

	return true
}
