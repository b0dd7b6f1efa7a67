package tftp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pin/tftp/v3/netascii"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/ipv4"
	"golang.org/x/time/rate"

	"github.com/outpost-metal/outpost/edge/limits"
)

// Config configures the TFTP server.
type Config struct {
	// Listen is the UDP address to serve (default ":69").
	Listen string `json:"listen"`
	// Dir is where the iPXE binaries are read from at start-up.
	Dir string `json:"dir"`
	// BlockSize is the largest blksize granted (RFC 2348); it is clamped further to the receiving
	// interface's MTU minus 28 bytes. 1468 fits a 1500-byte MTU.
	BlockSize int `json:"block_size"`
	// Timeout is how long the server waits for an acknowledgement before sending a packet again.
	Timeout time.Duration `json:"timeout"`
	// Retries is how many times one packet is sent again to a client that has acknowledged an earlier one.
	Retries int `json:"retries"`
	// FirstRetries is how many times the first packet (OACK or DATA 1) is sent again to a client that has
	// acknowledged nothing yet: a request with a forged source earns 1+FirstRetries packets at most.
	FirstRetries int `json:"first_retries"`
	// MaxResends bounds the packets sent again over one whole transfer.
	MaxResends int `json:"max_resends"`
	// MaxTransferTime bounds one transfer from request to last acknowledgement (a client that acknowledges
	// each block just before the timeout would otherwise hold its transfer for blocks × Timeout).
	MaxTransferTime time.Duration `json:"max_transfer_time"`
	// MaxTransfers bounds the transfers in progress, MaxTransfersPerSource those of one client address. At a
	// bound, the oldest transfer whose client has acknowledged nothing yet is ended to make room (the source's
	// own at the per-source bound); when every transfer is acknowledged, the request is refused.
	MaxTransfers          int `json:"max_transfers"`
	MaxTransfersPerSource int `json:"max_transfers_per_source"`
	// ErrorRate bounds the error packets per second answering requests refused for good (no such file, a bad
	// name, a write); beyond it they get no answer (counted), so a flood with forged sources cannot use the
	// edge to send packets at any rate. Requests refused for now (at a limit) are never answered: see shed.
	ErrorRate int `json:"error_rate"`
	// EventRate bounds the refused requests per second reported to the observer (the event journal);
	// beyond it they are counted only. Completed transfers are always reported.
	EventRate int `json:"event_rate"`
}

// Default returns the production defaults, sized for a site of thousands of machines (see the edge's
// --tftp-max-transfers): a ROM fetches its iPXE binary in well under a second on its own L2, so even a
// site-wide power-on keeps a few hundred transfers in progress at once, under MaxTransfers; a ROM needs
// one or two at a time (a tsize probe, then the fetch), under MaxTransfersPerSource.
func Default() Config {
	return Config{
		Listen: ":69", Dir: DefaultDir, BlockSize: 1468,
		Timeout: time.Second, Retries: 4, FirstRetries: 2, MaxResends: 64, MaxTransferTime: 2 * time.Minute,
		MaxTransfers: 1024, MaxTransfersPerSource: 4,
		ErrorRate: 500, EventRate: 20,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	if c.Listen == "" {
		errs = append(errs, errors.New("listen is required"))
	}

	if c.Dir == "" {
		errs = append(errs, errors.New("dir is required"))
	}

	if c.BlockSize < minBlockSize || c.BlockSize > maxBlockSize {
		errs = append(errs, fmt.Errorf("block_size %d outside 512..65464", c.BlockSize))
	}

	if c.Timeout <= 0 || c.Retries <= 0 || c.FirstRetries < 0 || c.MaxResends < 0 || c.MaxTransferTime <= 0 {
		errs = append(errs, errors.New("timeout, retries and max_transfer_time must be positive, first_retries and max_resends not negative"))
	}

	if c.MaxTransfers <= 0 || c.MaxTransfersPerSource <= 0 || c.MaxTransfersPerSource > c.MaxTransfers {
		errs = append(errs, fmt.Errorf("max_transfers %d and max_transfers_per_source %d: both positive, per source at most the total",
			c.MaxTransfers, c.MaxTransfersPerSource))
	}

	if c.ErrorRate <= 0 || c.EventRate <= 0 {
		errs = append(errs, errors.New("error_rate and event_rate must be positive"))
	}

	return errors.Join(errs...)
}

// Fetch describes a completed or refused transfer, for the event journal ("PXE seen").
type Fetch struct {
	Name   string
	Remote netip.Addr
	// Err is nil for a completed transfer.
	Err error
}

// Observer is told about transfers.
type Observer interface {
	TFTPFetch(Fetch)
}

// Deps are the server's optional collaborators.
type Deps struct {
	Registerer prometheus.Registerer
	Observer   Observer
	// Clock paces the error and event rates and the refusal log (default: the wall clock).
	Clock limits.Clock
}

// Request results (the "result" label of outpost_tftp_requests_total).
const (
	resultServed       = "served"
	resultNotFound     = "not_found"
	resultBadName      = "bad_name"
	resultBadRequest   = "bad_request"
	resultWrite        = "write_refused"
	resultDuplicate    = "duplicate"
	resultIgnored      = "ignored"
	resultPerSource    = "refused_per_source"
	resultTotal        = "refused_total"
	resultNoSocket     = "no_socket"
	resultOverloaded   = "overloaded"
	resultTooSlow      = "too_slow"
	resultResendBudget = "resend_budget"
)

// Server is the read-only TFTP server.
type Server struct {
	cfg     Config
	log     *zap.Logger
	catalog *Catalog
	deps    Deps

	lim      *limits.Limiter
	rejects  *limits.RejectLog
	errRate  *rate.Limiter
	evRate   *rate.Limiter
	hints    map[string]string
	mtuCache map[int]mtuEntry // read loop only

	requests      *prometheus.CounterVec
	transfers     *prometheus.CounterVec
	errorsDropped prometheus.Counter
	eventsDropped prometheus.Counter

	mu     sync.Mutex
	active map[netip.AddrPort]*transfer
	wg     sync.WaitGroup
	// running counts transfer goroutines, those of evicted transfers on their way out included.
	running atomic.Int64

	nServed, nRefused atomic.Int64
}

// New builds the server over a catalog (see LoadCatalog).
func New(cfg Config, logger *zap.Logger, catalog *Catalog, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tftp config: %w", err)
	}

	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}

	log := logger.With(zap.String("component", "tftp"))

	s := &Server{
		cfg: cfg, log: log, catalog: catalog, deps: deps,
		lim:      limits.New(limits.Config{Total: cfg.MaxTransfers, PerSource: cfg.MaxTransfersPerSource}),
		rejects:  limits.NewRejectLog(log, "tftp request refused", limits.DefaultLogInterval, deps.Clock),
		errRate:  rate.NewLimiter(rate.Limit(cfg.ErrorRate), cfg.ErrorRate),
		evRate:   rate.NewLimiter(rate.Limit(cfg.EventRate), cfg.EventRate),
		mtuCache: map[int]mtuEntry{},
		active:   map[netip.AddrPort]*transfer{},
		hints: map[string]string{
			resultPerSource: fmt.Sprintf("this address already has %d transfers in progress, all acknowledged (--tftp-max-per-source); a ROM needs one or two",
				cfg.MaxTransfersPerSource),
			resultTotal: fmt.Sprintf("%d transfers in progress, all acknowledged (--tftp-max-transfers); raise it if a real boot storm is refused",
				cfg.MaxTransfers),
			resultNotFound:     "not one of the served iPXE binaries (--ipxe-dir)",
			resultNoSocket:     "no socket for the transfer: the process may be at its open-files limit",
			resultOverloaded:   "ended transfers are not gone yet: the edge is short of CPU for this request rate",
			resultTooSlow:      fmt.Sprintf("client cut off: the transfer took longer than %s", cfg.MaxTransferTime),
			resultResendBudget: fmt.Sprintf("client cut off: more than %d packets sent again in one transfer", cfg.MaxResends),
		},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_tftp_requests_total",
			Help: "TFTP requests, by result (served, not_found, bad_name, bad_request, write_refused, duplicate, ignored, " +
				"refused_per_source, refused_total, no_socket, overloaded).",
		}, []string{"result"}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_tftp_transfers_total",
			Help: "TFTP transfers finished, by outcome (ok, aborted_by_client, timeout, too_slow, resend_budget, evicted, shutdown, send_failed).",
		}, []string{"outcome"}),
		errorsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_tftp_error_replies_dropped_total", Help: "Refused TFTP requests left unanswered because error replies were over error_rate.",
		}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_tftp_events_dropped_total", Help: "Refused TFTP requests not reported to the event journal because they were over event_rate.",
		}),
	}

	for _, c := range []prometheus.Collector{
		s.requests, s.transfers, s.errorsDropped, s.eventsDropped, s.lim.Collector("outpost_tftp_transfers", "TFTP transfers"),
	} {
		if err := deps.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register tftp metrics: %w", err)
		}
	}

	s.log.Info("tftp ready", zap.Strings("files", catalog.Names()), zap.Int("block_size", cfg.BlockSize),
		zap.Int("max_transfers", cfg.MaxTransfers), zap.Int("max_transfers_per_source", cfg.MaxTransfersPerSource))

	return s, nil
}

// Counters returns named counts for the edge status RPC.
func (s *Server) Counters() map[string]int64 {
	return map[string]int64{"tftp_served": s.nServed.Load(), "tftp_refused": s.nRefused.Load()}
}

// Stats returns the transfer limiter's counts (transfers in progress, refused and evicted).
func (s *Server) Stats() limits.Stats { return s.lim.Stats() }

// Run listens on cfg.Listen and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var lc net.ListenConfig

	conn, err := lc.ListenPacket(ctx, "udp4", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen tftp on %s: %w", s.cfg.Listen, err)
	}

	return s.Serve(ctx, conn)
}

// Serve answers requests on conn until ctx ends, then gives the transfers in progress a moment to finish
// and ends the rest. It closes conn.
//
// One goroutine reads the server port and decides every request at once: a refused request costs no socket
// and no goroutine. Each admitted transfer has its own socket (its TID, RFC 1350) and goroutine, so there are
// at most MaxTransfers of each.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	defer s.rejects.Flush()

	port := newPort(conn)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) }) //nolint:errcheck // ends the read loop

	buf := make([]byte, 2048)

	var err error

	for {
		n, p, rerr := port.read(buf)
		if rerr != nil {
			if ctx.Err() == nil && transientReadError(rerr) {
				continue
			}

			if ctx.Err() == nil {
				err = fmt.Errorf("serve tftp: %w", rerr)
			}

			break
		}

		s.handle(port, buf[:n], p)
	}

	stop()
	conn.Close() //nolint:errcheck,gosec // the read loop is done with it
	s.drain()

	return err
}

// transientReadError reports whether a read error on the server port concerns one datagram (an ICMP error
// reported on the socket, a signal, no buffer for a moment) rather than the socket.
func transientReadError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.EAGAIN)
}

// drain ends the transfers whose client never acknowledged anything, gives the others two timeouts (at most
// 5 s) to finish, and ends what is left.
func (s *Server) drain() {
	s.endTransfers(func(t *transfer) bool { return !t.acked.Load() })

	done := make(chan struct{})

	go func() {
		s.wg.Wait()
		close(done)
	}()

	grace := time.NewTimer(min(2*s.cfg.Timeout, 5*time.Second))
	defer grace.Stop()

	select {
	case <-done:
		return
	case <-grace.C:
	}

	s.endTransfers(func(*transfer) bool { return true })
	<-done
}

func (s *Server) endTransfers(which func(*transfer) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()

	for _, t := range s.active {
		if which(t) {
			t.end(outcomeShutdown)
		}
	}
}

func (s *Server) handle(port *port, b []byte, p packet) {
	req, err := ParseRequest(b)

	switch {
	case errors.Is(err, ErrNotRequest):
		s.requests.WithLabelValues(resultIgnored).Inc()

		return
	case err != nil:
		s.refuse(port, p, resultBadRequest, errIllegalOp, "bad request", zap.Error(err))

		return
	case req.Write:
		s.refuse(port, p, resultWrite, errAccessViolation, "read-only", zap.String("name", req.Filename))

		return
	}

	// A client that sends its request again (our first packet was slow or lost) already has its transfer.
	if s.isActive(p.src) {
		s.requests.WithLabelValues(resultDuplicate).Inc()

		return
	}

	f, err := s.catalog.Lookup(req.Filename)
	if err != nil {
		result, code, msg := resultNotFound, errFileNotFound, "file not found"
		if errors.Is(err, ErrBadName) {
			result, code, msg = resultBadName, errAccessViolation, "bad name"
		}

		s.refuse(port, p, result, code, msg, zap.String("name", req.Filename), zap.Error(err))
		s.report(Fetch{Name: req.Filename, Remote: p.src.Addr(), Err: err})

		return
	}

	// An evicted transfer's socket closes at once, its goroutine exits when next scheduled: on a starved CPU
	// they could pile up, so beyond half the bound again new requests wait for them.
	if s.running.Load() >= int64(s.cfg.MaxTransfers+s.cfg.MaxTransfers/2) {
		s.shed(p, resultOverloaded, zap.String("name", f.Name))

		return
	}

	t := &transfer{s: s, remote: p.src, name: f.Name, start: time.Now()}

	slot, err := s.lim.Acquire(p.src.Addr(), func() { t.end(outcomeEvicted) })
	if err != nil {
		result := resultTotal

		re, _ := limits.AsRefused(err)
		if re != nil && re.Reason == limits.PerSource {
			result = resultPerSource
		}

		s.shed(p, result, zap.String("name", f.Name))

		return
	}

	if err := t.open(p.dst); err != nil {
		slot.Release()
		s.shed(p, resultNoSocket, zap.String("name", f.Name), zap.Error(err))

		return
	}

	t.slot = slot
	t.prepare(req, f, s.blockLimit(p))

	s.mu.Lock()
	s.active[p.src] = t
	s.mu.Unlock()

	s.requests.WithLabelValues(resultServed).Inc()
	s.wg.Add(1)
	s.running.Add(1)

	go t.run()
}

func (s *Server) isActive(src netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	_, ok := s.active[src]

	return ok
}

// refuse counts and logs a request refused for good (no such file, a bad name or request, a write) and
// answers it with an error packet at once, while under ErrorRate; beyond it the request gets no answer.
func (s *Server) refuse(port *port, p packet, result string, code uint16, msg string, fields ...zap.Field) {
	s.note(p, result, fields...)

	if !s.errRate.AllowN(s.now(), 1) {
		s.errorsDropped.Inc()

		return
	}

	if err := port.write(appendError(nil, code, msg), p); err != nil {
		s.log.Debug("tftp error reply not sent", zap.Stringer("remote", p.src), zap.Error(err))
	}
}

// shed counts and logs a request refused for now (a limit, no socket, overload) and leaves it unanswered: a
// ROM gives up the boot file at an error packet (EDK2's and iPXE's TFTP clients end the transfer with it),
// but sends a request that got no answer again a second or so later, when a transfer has most likely ended.
func (s *Server) shed(p packet, result string, fields ...zap.Field) {
	s.note(p, result, fields...)
}

func (s *Server) note(p packet, result string, fields ...zap.Field) {
	s.requests.WithLabelValues(result).Inc()
	s.nRefused.Add(1)

	fields = append(fields, zap.Stringer("remote", p.src))
	if h := s.hints[result]; h != "" {
		fields = append(fields, zap.String("hint", h))
	}

	s.rejects.Note(result, fields...)
}

// report tells the observer about a refused request while under EventRate.
func (s *Server) report(f Fetch) {
	if s.deps.Observer == nil {
		return
	}

	if !s.evRate.AllowN(s.now(), 1) {
		s.eventsDropped.Inc()

		return
	}

	s.deps.Observer.TFTPFetch(f)
}

func (s *Server) now() time.Time {
	if s.deps.Clock != nil {
		return s.deps.Clock.Now()
	}

	return time.Now()
}

type mtuEntry struct {
	mtu int
	at  time.Time
}

// blockLimit is the largest blksize for a request that came in on p's interface: BlockSize, clamped to the
// interface MTU minus the IP and UDP headers (looked up once a minute per interface).
func (s *Server) blockLimit(p packet) int {
	if p.ifIndex <= 0 {
		return s.cfg.BlockSize
	}

	e, ok := s.mtuCache[p.ifIndex]
	if !ok || time.Since(e.at) > time.Minute {
		e = mtuEntry{at: time.Now()}

		if ifi, err := net.InterfaceByIndex(p.ifIndex); err == nil {
			e.mtu = ifi.MTU
		}

		s.mtuCache[p.ifIndex] = e
	}

	overhead := 28 // IPv4 and UDP headers
	if p.dst.Is6() && !p.dst.Is4In6() {
		overhead = 48
	}

	if e.mtu-overhead < minBlockSize {
		return s.cfg.BlockSize
	}

	return min(s.cfg.BlockSize, e.mtu-overhead)
}

// packet is where a datagram came from and, when the socket tells, where it went.
type packet struct {
	src     netip.AddrPort
	dst     netip.Addr
	ifIndex int
}

// port reads the server port, with the destination address and interface of each datagram when the socket
// is an IPv4 UDP socket (the transfer then answers from the address the client asked).
type port struct {
	conn net.PacketConn
	pc4  *ipv4.PacketConn
}

func newPort(conn net.PacketConn) *port {
	p := &port{conn: conn}

	if uc, ok := conn.(*net.UDPConn); ok {
		if la, ok := uc.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() != nil {
			pc := ipv4.NewPacketConn(uc)
			if pc.SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true) == nil {
				p.pc4 = pc
			}
		}
	}

	return p
}

func (p *port) read(b []byte) (int, packet, error) {
	var (
		n   int
		cm  *ipv4.ControlMessage
		src net.Addr
		err error
	)

	if p.pc4 != nil {
		n, cm, src, err = p.pc4.ReadFrom(b)
	} else {
		n, src, err = p.conn.ReadFrom(b)
	}

	if err != nil {
		return 0, packet{}, err
	}

	var pk packet

	if ua, ok := src.(*net.UDPAddr); ok {
		ap := ua.AddrPort()
		pk.src = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}

	if cm != nil {
		if a, ok := netip.AddrFromSlice(cm.Dst); ok {
			pk.dst = a.Unmap()
		}

		pk.ifIndex = cm.IfIndex
	}

	return n, pk, nil
}

// write answers p from the address p was sent to, when known.
func (p *port) write(b []byte, to packet) error {
	addr := net.UDPAddrFromAddrPort(to.src)

	if p.pc4 != nil && to.dst.Is4() && !to.dst.IsMulticast() && to.dst != netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		_, err := p.pc4.WriteTo(b, &ipv4.ControlMessage{Src: to.dst.AsSlice()}, addr)

		return err
	}

	_, err := p.conn.WriteTo(b, addr)

	return err
}

// netasciiOf returns data in netascii (RFC 764: CR LF line ends, CR NUL for a bare CR).
func netasciiOf(data []byte) []byte {
	out, err := io.ReadAll(netascii.ToReader(bytes.NewReader(data)))
	if err != nil {
		return data // unreachable: reading memory does not fail
	}

	return out
}
