// Package tftp serves the boot files (edge/bootfiles) read-only over TFTP with pin/tftp/v3 (RFC 1350, with the
// blksize and tsize options of RFC 2347, 2348 and 2349), behind an admission filter that keeps the site network
// within bounds it cannot exceed: transfers per client address and in total, requests per second per address,
// sends per packet and per transfer, time per transfer, error replies and journal events per second.
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
	"time"

	pintftp "github.com/pin/tftp/v3"
	"github.com/pin/tftp/v3/netascii"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/time/rate"

	"github.com/outpost-metal/outpost/edge/limits"

	"github.com/outpost-metal/outpost/edge/bootfiles"
)

// Config configures the TFTP server.
type Config struct {
	// Listen is the UDP address to serve (default ":69").
	Listen string
	// Dir is where the iPXE binaries are read from at start-up.
	Dir string
	// BlockSize is the largest blksize granted (RFC 2348); it is clamped further to the receiving
	// interface's MTU minus 28 bytes. 1468 fits a 1500-byte MTU.
	BlockSize int
	// Timeout is how long the server waits for an acknowledgement before sending a packet again.
	Timeout time.Duration
	// Retries is how many times one packet is sent again to a client that has acknowledged an earlier one.
	Retries int
	// FirstRetries is how many times the first packet (OACK or DATA 1) is sent again to a client that has
	// acknowledged nothing yet: a request with a forged source earns 1+FirstRetries packets at most.
	FirstRetries int
	// MaxResends bounds the packets sent again over one whole transfer.
	MaxResends int
	// MaxTransferTime bounds one transfer from request to last acknowledgement (a client that acknowledges
	// each block just before the timeout would otherwise hold its transfer for blocks × Timeout).
	MaxTransferTime time.Duration
	// MaxTransfers bounds the transfers in progress, MaxTransfersPerSource those of one client address. At a
	// bound, the oldest transfer whose client has acknowledged nothing yet is ended to make room (the source's
	// own at the per-source bound); when every transfer is acknowledged, the request is refused.
	MaxTransfers          int
	MaxTransfersPerSource int
	// RequestRatePerSource bounds the requests per second one client address sends (bursts of twice as many);
	// beyond it they are dropped unanswered before anything else is decided. A ROM sends one or two a boot,
	// and again each time one goes unanswered.
	RequestRatePerSource int
	// ErrorRate bounds the error packets per second answering requests refused for good (no such file, a bad
	// name, a write); beyond it they get no answer (counted), so a flood with forged sources cannot use the
	// edge to send packets at any rate. Requests refused for now (at a limit) are never answered: see shed.
	ErrorRate int
	// EventRate bounds the refused requests per second reported to the observer (the event journal);
	// beyond it they are counted only. Completed transfers are always reported.
	EventRate int
}

// Default returns the production defaults, sized for a site of thousands of machines (see the edge's
// --tftp-max-transfers): a ROM fetches its iPXE binary in well under a second on its own L2, so even a
// site-wide power-on keeps a few hundred transfers in progress at once, under MaxTransfers; a ROM needs
// one or two at a time (a tsize probe, then the fetch), under MaxTransfersPerSource.
func Default() Config {
	return Config{
		Listen: ":69", Dir: bootfiles.DefaultDir, BlockSize: 1468,
		Timeout: time.Second, Retries: 4, FirstRetries: 2, MaxResends: 64, MaxTransferTime: 2 * time.Minute,
		MaxTransfers: 1024, MaxTransfersPerSource: 4, RequestRatePerSource: 10,
		ErrorRate: 500, EventRate: 20,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	if c.Listen == "" {
		errs = append(errs, errors.New("a listen address is required (--tftp-listen)"))
	}

	if c.Dir == "" {
		errs = append(errs, errors.New("a boot-file directory is required (--ipxe-dir)"))
	}

	if c.BlockSize < minBlockSize || c.BlockSize > maxBlockSize {
		errs = append(errs, fmt.Errorf("block size %d outside 512..65464", c.BlockSize))
	}

	if c.Timeout <= 0 || c.Retries <= 0 || c.FirstRetries < 0 || c.MaxResends < 0 || c.MaxTransferTime <= 0 {
		errs = append(errs, errors.New("the timeout, retries and transfer time must be positive, first retries and resends not negative"))
	}

	if c.MaxTransfers <= 0 || c.MaxTransfersPerSource <= 0 || c.MaxTransfersPerSource > c.MaxTransfers {
		errs = append(errs, fmt.Errorf("--tftp-max-transfers %d and --tftp-max-per-source %d: both positive, per source at most the total",
			c.MaxTransfers, c.MaxTransfersPerSource))
	}

	if c.RequestRatePerSource <= 0 || c.ErrorRate <= 0 || c.EventRate <= 0 {
		errs = append(errs, errors.New("the request rate per source, error rate and event rate must be positive"))
	}

	return errors.Join(errs...)
}

// Observer is told about transfers.
type Observer interface {
	TFTPFetch(bootfiles.Fetch)
}

// Deps are the server's optional collaborators.
type Deps struct {
	Registerer prometheus.Registerer
	Observer   Observer
	// Clock paces the request, error and event rates and the refusal log (default: the wall clock).
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
	resultRateLimited  = "rate_limited"
	resultPerSource    = "refused_per_source"
	resultTotal        = "refused_total"
	resultOverloaded   = "overloaded"
	resultTooSlow      = outcomeTooSlow
	resultResendBudget = outcomeResendBudget
)

// Server is the read-only TFTP server: pin/tftp behind an admission filter (see filter).
type Server struct {
	cfg     Config
	log     *zap.Logger
	catalog *bootfiles.Catalog
	deps    Deps

	lim     *limits.Limiter
	rejects *limits.RejectLog
	errRate *rate.Limiter
	evRate  *rate.Limiter
	hints   map[string]string

	requests      *prometheus.CounterVec
	transfers     *prometheus.CounterVec
	errorsDropped prometheus.Counter
	eventsDropped prometheus.Counter

	// netasciiSizes caches the size of each file in netascii (its tsize in that mode), by *bootfiles.File.
	netasciiSizes sync.Map

	nServed, nRefused atomic.Int64
}

// New builds the server over a catalog (see bootfiles.LoadCatalog).
func New(cfg Config, logger *zap.Logger, catalog *bootfiles.Catalog, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tftp config: %w", err)
	}

	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}

	log := logger.With(zap.String("component", "tftp"))

	s := &Server{
		cfg: cfg, log: log, catalog: catalog, deps: deps,
		lim:     limits.New(limits.Config{Total: cfg.MaxTransfers, PerSource: cfg.MaxTransfersPerSource}),
		rejects: limits.NewRejectLog(log, "tftp request refused", limits.DefaultLogInterval, deps.Clock),
		errRate: rate.NewLimiter(rate.Limit(cfg.ErrorRate), cfg.ErrorRate),
		evRate:  rate.NewLimiter(rate.Limit(cfg.EventRate), cfg.EventRate),
		hints: map[string]string{
			resultPerSource: fmt.Sprintf("this address already has %d transfers in progress, all acknowledged (--tftp-max-per-source); a ROM needs one or two",
				cfg.MaxTransfersPerSource),
			resultTotal: fmt.Sprintf("%d transfers in progress, all acknowledged (--tftp-max-transfers); raise it if a real boot storm is refused",
				cfg.MaxTransfers),
			resultRateLimited: fmt.Sprintf("more than %d requests a second from this address (request_rate_per_source); a ROM sends one or two a boot",
				cfg.RequestRatePerSource),
			resultNotFound:     "not one of the served iPXE binaries (--ipxe-dir)",
			resultOverloaded:   "ended transfers are not gone yet: the edge is short of CPU for this request rate",
			resultTooSlow:      fmt.Sprintf("client cut off: the transfer took longer than %s", cfg.MaxTransferTime),
			resultResendBudget: fmt.Sprintf("client cut off: more than %d packets sent again in one transfer", cfg.MaxResends),
		},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_tftp_requests_total",
			Help: "TFTP requests, by result (served, not_found, bad_name, bad_request, write_refused, duplicate, ignored, " +
				"rate_limited, refused_per_source, refused_total, overloaded).",
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
// The protocol is pin/tftp's (v3.2.0), in single-port mode, reading and writing conn through the admission
// filter (see filter). What the library cannot do, and how the edge keeps the bound anyway:
//
//   - In its default mode each transfer has a socket of its own, which nothing outside the library sees, and
//     a transfer waiting for the acknowledgement of its first packet cannot be ended from outside: its read
//     handler's reader is read only after an acknowledgement, so failing the reader does not reach it. Each
//     request with a forged source would hold its place for 1+Retries timeouts, and a flood would fill the
//     bound with them (measured with this filter in front: under the flood test's 5,000 requests/s the real
//     client's request was never answered). In single-port mode every packet passes the filter, which ends
//     such a transfer by handing the library an error from its client, and no transfer needs a socket.
//   - It has one retry count for every packet, no resend or time budget per transfer: the filter counts the
//     sends and fails the send that goes beyond FirstRetries, MaxResends or MaxTransferTime.
//   - Through a connection that is not a *net.UDPConn it sees no IP_PKTINFO: it cannot clamp blksize to the
//     MTU of the interface (it would cap blocks at 512 bytes) nor answer from the address the request was
//     sent to. The filter clamps the blksize in the request it hands over and sends from that address.
//   - It compares option names and the mode case-sensitively (RFC 2347 says they are not): the filter hands
//     it lower-case ones.
//   - It answers a refused read from a transfer of its own, keyed by the client's address: the filter
//     answers refusals itself (see filter.refuse).
//   - Its error packets always carry code 1 (file not found); a client cut off for being too slow is told so
//     in the message, with that code.
//   - In single-port mode its server port is the TID (RFC 1350 has the server pick a random one per
//     transfer), so a forger on the site network can acknowledge its forged transfers blindly: they are then
//     bounded as live clients are (MaxTransferTime, MaxResends, the per-source and total bounds), not by a
//     port the forger would have to guess. SetAnticipate (several blocks per acknowledgement) is not used:
//     ROMs acknowledge every block, and the library's single-port inbox holds one datagram per transfer.
//   - In single-port mode its read loop can hand a datagram to a transfer's inbox as the transfer closes it
//     (a send on a closed channel: a panic). A client that acknowledges its last block twice is enough. The
//     filter hands a transfer nothing once the library has begun to end it (see filter.libraryEnds).
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	defer s.rejects.Flush()

	f := newFilter(s, conn)

	lib := pintftp.NewServer(func(name string, rf io.ReaderFrom) error { return s.read(f, name, rf) }, nil)
	// Before EnableSinglePort, which otherwise caps blocks at 512 bytes. The library sees no control
	// messages through the filter, so its MTU clamp would cap every block at 512 as well: the filter clamps
	// the blksize of each request instead.
	lib.SetBlockSize(s.cfg.BlockSize)
	lib.SetBlockSizeNegotiation(false)
	lib.SetTimeout(s.cfg.Timeout)
	lib.SetRetries(s.cfg.Retries)
	// A packet goes again after Timeout, not after a further random wait of up to a second.
	lib.SetBackoff(func(int) time.Duration { return 0 })
	lib.SetHook(hook{f})
	lib.EnableSinglePort()

	served := make(chan error, 1)

	go func() { served <- lib.Serve(f) }()

	var err error

	select {
	case <-ctx.Done():
	case rerr := <-f.failed:
		err = fmt.Errorf("serve tftp: %w", rerr)
	case serr := <-served:
		// The library returns early only when conn's address is not an IP address.
		f.Close() //nolint:errcheck // nothing was served

		return fmt.Errorf("serve tftp: %w", serr)
	}

	f.drain(min(2*s.cfg.Timeout, 5*time.Second))
	f.stop()
	lib.Shutdown()

	if serr := <-served; serr != nil && err == nil {
		err = fmt.Errorf("serve tftp: %w", serr)
	}

	return err
}

// read is the library's read handler, called for each transfer the filter admitted.
func (s *Server) read(f *filter, _ string, rf io.ReaderFrom) error {
	ot, ok := rf.(pintftp.OutgoingTransfer)
	if !ok {
		return errors.New("no remote address")
	}

	ra := ot.RemoteAddr()
	ap := ra.AddrPort()

	t := f.lookup(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	if t == nil {
		return errors.New("not admitted") // unreachable: the filter hands the library only admitted requests
	}

	ot.SetSize(s.sizeOf(t.file, t.mode))

	_, err := rf.ReadFrom(t.file.Reader())
	s.finished(t, f.finish(t, err))

	// The library has ended the transfer by now: an error returned is not sent again.
	return err
}

// sizeOf is the file's transfer size in mode (the library converts the bytes to netascii as it sends them).
func (s *Server) sizeOf(f *bootfiles.File, mode string) int64 {
	if mode != "netascii" {
		return int64(len(f.Data))
	}

	if n, ok := s.netasciiSizes.Load(f); ok {
		return n.(int64) // the map holds only int64
	}

	n, _ := io.Copy(io.Discard, netascii.ToReader(bytes.NewReader(f.Data))) //nolint:errcheck // reading memory does not fail
	s.netasciiSizes.Store(f, n)

	return n
}

// finished counts, logs and reports a transfer whose handler returned.
func (s *Server) finished(t *transfer, outcome string) {
	s.transfers.WithLabelValues(outcome).Inc()

	fields := func() []zap.Field {
		return []zap.Field{
			zap.String("name", t.file.Name), zap.Stringer("remote", t.remote), zap.String("outcome", outcome),
			zap.Duration("took", time.Since(t.start)),
		}
	}

	switch outcome {
	case outcomeOK:
		s.nServed.Add(1)

		if ce := s.log.Check(zapcore.DebugLevel, "tftp transfer done"); ce != nil {
			ce.Write(fields()...)
		}

		if s.deps.Observer != nil {
			s.deps.Observer.TFTPFetch(bootfiles.Fetch{Name: t.file.Name, Remote: t.remote.Addr()})
		}
	case outcomeTooSlow, outcomeResendBudget:
		s.rejects.Note(outcome, append(fields(), zap.String("hint", s.hints[outcome]))...)
	default:
		// EDK2 asks for tsize and aborts before downloading; forged or vanished clients time out: normal.
		if ce := s.log.Check(zapcore.DebugLevel, "tftp transfer ended early"); ce != nil {
			ce.Write(fields()...)
		}
	}
}

func (s *Server) count(result string) { s.requests.WithLabelValues(result).Inc() }

// shed counts and logs a request refused for now (a limit, the request rate, overload) and leaves it
// unanswered: a ROM gives up the boot file at an error packet (EDK2's and iPXE's TFTP clients end the
// transfer with it), but sends a request that got no answer again a second or so later, when a transfer has
// most likely ended.
func (s *Server) shed(remote netip.AddrPort, result string, fields ...zap.Field) {
	s.note(remote, result, fields...)
}

// note counts and logs (within the RejectLog's interval) a refused request.
func (s *Server) note(remote netip.AddrPort, result string, fields ...zap.Field) {
	s.count(result)
	s.nRefused.Add(1)

	fields = append(fields, zap.Stringer("remote", remote))
	if h := s.hints[result]; h != "" {
		fields = append(fields, zap.String("hint", h))
	}

	s.rejects.Note(result, fields...)
}

// report tells the observer about a refused request while under EventRate.
func (s *Server) report(f bootfiles.Fetch) {
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

// hook hears from the library about transfers that failed, the filter's only interest being one it could
// not start (an admitted request must not keep its admission).
type hook struct{ f *filter }

// OnSuccess is called from a transfer's goroutine just before the library ends it.
func (h hook) OnSuccess(st pintftp.TransferStats) { h.ends(st) }

// OnFailure is called by the library's read loop, with no remote address, when it could not start a transfer
// for a datagram; with its remote address, from a transfer's goroutine just before the library ends it (the
// handler counts the outcome).
func (h hook) OnFailure(st pintftp.TransferStats, _ error) {
	if st.RemoteAddr == nil {
		h.f.unstarted()

		return
	}

	h.ends(st)
}

// ends tells the filter the library is about to close the transfer's inbox. The library's TID is the
// client's port.
func (h hook) ends(st pintftp.TransferStats) {
	if a, ok := netip.AddrFromSlice(st.RemoteAddr); ok && st.Tid > 0 && st.Tid <= 0xffff {
		h.f.libraryEnds(netip.AddrPortFrom(a.Unmap(), uint16(st.Tid)))
	}
}
