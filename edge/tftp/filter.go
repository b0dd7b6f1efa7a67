package tftp

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/ipv4"

	"github.com/outpost-metal/outpost/edge/limits"

	"github.com/outpost-metal/outpost/edge/bootfiles"
)

// Transfer outcomes (the "outcome" label of outpost_tftp_transfers_total).
const (
	outcomeOK           = "ok"
	outcomeAborted      = "aborted_by_client"
	outcomeTimeout      = "timeout"
	outcomeTooSlow      = "too_slow"
	outcomeResendBudget = "resend_budget"
	outcomeEvicted      = "evicted"
	outcomeShutdown     = "shutdown"
	outcomeSendFailed   = "send_failed"
)

// filter is the server port as pin/tftp sees it: a net.PacketConn over the real one that decides every
// datagram before the library reads it. The library runs in single-port mode, so every packet of every
// transfer passes here in both directions, and the filter
//
//   - admits a read request only within the transfer limits (limits.Limiter: per source and in total, the
//     oldest transfer whose client has acknowledged nothing making room) and the per-source request rate;
//     what it refuses costs the library nothing, because the library never sees it;
//   - answers the requests refused for good (no such file, a bad name, a write) itself, at most ErrorRate a
//     second, and leaves those refused for now (a limit) unanswered, for the ROM's retransmission;
//   - passes on only what a transfer in progress expects from its client (the acknowledgement of the packet
//     last sent, or an error) and notes the first acknowledgement, after which a transfer is no longer evictable;
//   - ends a transfer from outside (eviction, shutdown) by handing the library an error "from its client",
//     and ends one at its next send (too many sends to a client that never acknowledged, the resend budget,
//     the time budget) by failing that send;
//   - sends the library's packets from the address the request was sent to, and clamps blksize to the MTU
//     of the interface it came in on (the library learns neither through a wrapped connection).
//
// Each admitted transfer costs one goroutine (the library's) and no socket; an ended transfer's goroutine
// exits as soon as the library reads the error handed to it.
type filter struct {
	s    *Server
	conn net.PacketConn
	// uc is conn when it is an IPv4 UDP socket: its datagrams then carry their destination and interface
	// (IP_PKTINFO, set through x/net; the reads and writes go through the standard library, which is cheaper).
	uc *net.UDPConn

	// The library reads from one goroutine: these are that goroutine's.
	buf          []byte
	oob          []byte
	out          []byte
	mtuCache     map[int]mtuEntry
	rates        *sourceRates
	lastAdmitted *transfer // handed to the library by the last ReadFrom

	// woken is set when a transfer ended from outside waits for its error to be read (see wake).
	woken  atomic.Bool
	wakeCh chan struct{}
	failed chan error // a read error about the socket rather than one datagram, at most one
	// nEnded is len(ended), and halted is set once stopped or fatal is: the read loop looks at them without
	// the lock, which a transfer's send takes at the same moment.
	nEnded atomic.Int32
	halted atomic.Bool
	// handed is set while the datagram ReadFrom returned last was for a transfer in progress (delivering):
	// the library hands it to that transfer's inbox after ReadFrom returns, and ReadFrom's next call says it
	// is done (see libraryEnds).
	handed atomic.Bool

	mu       sync.Mutex
	deadline time.Time // the library's read deadline
	active   map[netip.AddrPort]*transfer
	ended    []*transfer // ended from outside, their error not yet handed to the library
	closing  bool        // no new transfers
	stopped  bool        // the library is being stopped
	fatal    bool
	running  int            // admitted transfers whose handler has not returned (ended ones included)
	wg       sync.WaitGroup // the same, for drain
	// delivering is the transfer the library's read loop may be handing a datagram to now; delivered is
	// broadcast when that is done.
	delivering *transfer
	delivered  *sync.Cond
}

// transfer is the filter's record of an admitted read transfer. The fields below mu are guarded by filter.mu.
type transfer struct {
	remote netip.AddrPort
	oob    []byte // the control message that answers from the address the request was sent to (see sendFrom)
	file   *bootfiles.File
	mode   string
	start  time.Time
	slot   *limits.Slot

	acked     bool   // the client acknowledged a packet: no longer evictable, Retries instead of FirstRetries
	ended     string // the outcome, when the filter ended the transfer
	clientErr bool   // the client sent an error
	closing   bool   // the library has begun to end the transfer: it is handed nothing more
	done      bool   // the handler returned
	sentOp    uint16 // opcode and block of the packet last sent (0 before the first)
	sentBlock uint16
	sends     int // of the packet last sent
	resends   int // over the whole transfer
}

// packet is where a datagram came from and, when the socket tells, where it went.
type packet struct {
	src     netip.AddrPort
	dst     netip.Addr
	ifIndex int
}

type mtuEntry struct {
	mtu int
	at  time.Time
}

// endedError fails the send of a transfer the filter ended. It is not a net.Error, so the library does not
// retry the send: it aborts the transfer.
type endedError string

func (e endedError) Error() string { return string(e) }

var endedMessages = map[string]endedError{
	outcomeTimeout:      "no acknowledgement",
	outcomeTooSlow:      "too slow",
	outcomeResendBudget: "too many resends",
	outcomeEvicted:      "ended to make room",
	outcomeShutdown:     "server shutting down",
}

// stopTimeout is the timeout error ReadFrom returns once the library is stopping and nothing is in progress.
type stopTimeout struct{}

func (stopTimeout) Error() string   { return "tftp server stopping" }
func (stopTimeout) Timeout() bool   { return true }
func (stopTimeout) Temporary() bool { return true }

var _ net.Error = stopTimeout{}

// maxRateSources is how many source addresses the per-source request rate remembers.
const maxRateSources = 8192

func newFilter(s *Server, conn net.PacketConn) *filter {
	f := &filter{
		s: s, conn: conn,
		buf:      make([]byte, 65536),
		mtuCache: map[int]mtuEntry{},
		rates:    newSourceRates(s.cfg.RequestRatePerSource, 2*s.cfg.RequestRatePerSource, maxRateSources),
		wakeCh:   make(chan struct{}, 1),
		failed:   make(chan error, 1),
		active:   map[netip.AddrPort]*transfer{},
	}
	f.delivered = sync.NewCond(&f.mu)

	if uc, ok := conn.(*net.UDPConn); ok {
		if la, ok := uc.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() != nil {
			if ipv4.NewPacketConn(uc).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true) == nil {
				f.uc = uc
				f.oob = ipv4.NewControlMessage(ipv4.FlagDst | ipv4.FlagInterface)
			}
		}
	}

	return f
}

// ReadFrom returns the next datagram the library is to see: the error of a transfer ended from outside, or
// a datagram from the socket that the filter lets through (an admitted request, normalised, or what a
// transfer expects from its client).
func (f *filter) ReadFrom(b []byte) (int, net.Addr, error) {
	// The library has dealt with the previous datagram: an admitted request has its transfer by now, or
	// the hook was told it failed (see unstarted).
	f.lastAdmitted = nil

	if f.handed.Load() {
		f.mu.Lock()
		f.delivering = nil
		f.handed.Store(false)
		f.delivered.Broadcast()
		f.mu.Unlock()
	}

	for {
		if f.woken.Swap(false) {
			f.mu.Lock()
			d := f.deadline
			f.mu.Unlock()

			_ = f.conn.SetReadDeadline(d) //nolint:errcheck // the read reports a broken socket
		}

		if f.nEnded.Load() > 0 {
			if t := f.popEnded(); t != nil {
				return copy(b, appendError(nil, errNotDefined, "ended")), net.UDPAddrFromAddrPort(t.remote), nil
			}
		}

		if f.halted.Load() {
			f.mu.Lock()
			idle, fatal := f.stopped && f.running == 0, f.fatal
			f.mu.Unlock()

			if idle {
				return 0, nil, stopTimeout{}
			}

			if fatal {
				f.awaitWake()

				continue
			}
		}

		n, p, err := f.read()
		if err != nil {
			if f.readError(err) {
				continue
			}

			return 0, nil, err
		}

		out, ok := f.decide(f.buf[:n], p)
		if !ok {
			continue
		}

		if len(out) > len(b) {
			// Larger than the library reads (its buffer is BlockSize+4 bytes, a normalised request far less).
			if f.lastAdmitted != nil {
				f.unstarted()
			}

			f.s.count(resultIgnored)

			continue
		}

		return copy(b, out), net.UDPAddrFromAddrPort(p.src), nil
	}
}

// readError reports whether ReadFrom reads again after err: a wake (see wake), an error about one datagram
// (an ICMP error reported on the socket, a signal, no buffer for a moment), or a socket that is broken: that
// is reported to Serve once, and the filter then only hands the library the errors of ended transfers until
// it is stopped. The library's own read deadline is the library's to see.
func (f *filter) readError(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		f.mu.Lock()
		d := f.deadline
		f.mu.Unlock()

		return d.IsZero() || time.Now().Before(d)
	}

	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.EAGAIN) {
		return true
	}

	f.mu.Lock()
	first := !f.fatal
	f.fatal = true
	f.halted.Store(true)
	f.mu.Unlock()

	if first {
		f.failed <- err
	}

	return true
}

// awaitWake waits for a transfer to be ended or for the library's next timeout, when the socket is broken.
func (f *filter) awaitWake() {
	t := time.NewTimer(f.s.cfg.Timeout)
	defer t.Stop()

	select {
	case <-f.wakeCh:
	case <-t.C:
	}
}

func (f *filter) read() (int, packet, error) {
	var p packet

	if f.uc == nil {
		n, src, err := f.conn.ReadFrom(f.buf)
		if err != nil {
			return 0, p, err
		}

		if ua, ok := src.(*net.UDPAddr); ok {
			ap := ua.AddrPort()
			p.src = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		}

		return n, p, nil
	}

	n, oobn, _, src, err := f.uc.ReadMsgUDPAddrPort(f.buf, f.oob)
	if err != nil {
		return 0, p, err
	}

	p.src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())

	var cm ipv4.ControlMessage
	if cm.Parse(f.oob[:oobn]) == nil {
		if a, ok := netip.AddrFromSlice(cm.Dst); ok {
			p.dst = a.Unmap()
		}

		p.ifIndex = cm.IfIndex
	}

	return n, p, nil
}

// decide returns what of datagram b the library sees, if anything.
func (f *filter) decide(b []byte, p packet) ([]byte, bool) {
	if len(b) < 2 || !p.src.IsValid() {
		f.s.count(resultIgnored)

		return nil, false
	}

	switch op := binary.BigEndian.Uint16(b); op {
	case opRRQ, opWRQ:
		return f.request(b, p)
	case opACK, opERROR:
		if f.reply(op, b, p) {
			return b, true
		}
	}

	f.s.count(resultIgnored)

	return nil, false
}

// reply reports whether a client's ACK or ERROR goes to its transfer: an error does, an acknowledgement only
// of the packet last sent (any other one the library would ignore, after waiting afresh for the right one).
func (f *filter) reply(op uint16, b []byte, p packet) bool {
	f.mu.Lock()
	defer f.mu.Unlock()

	t := f.active[p.src]
	if t == nil || t.ended != "" || t.closing {
		return false
	}

	if op == opERROR {
		t.clientErr = true
		f.handing(t)

		return true
	}

	if t.sentOp == 0 || len(b) < 4 || binary.BigEndian.Uint16(b[2:]) != t.sentBlock {
		return false
	}

	if !t.acked {
		t.acked = true
		t.slot.SetEvictable(false)
	}

	f.handing(t)

	return true
}

// handing records (f.mu held) that the datagram ReadFrom returns goes to t's inbox in the library.
func (f *filter) handing(t *transfer) {
	f.delivering = t
	f.handed.Store(true)
}

// libraryEnds is called (through the hook) when the library is about to end the transfer for remote and
// close its inbox. The library's read loop looks the inbox up under its lock but sends to it after letting
// go of that lock, so a datagram handed over while the inbox is closed would be a send on a closed channel,
// a panic that ends the edge: from now on t is handed nothing, and libraryEnds waits until a datagram already
// handed over is in the inbox (the read loop's sends do not block, and it calls ReadFrom next).
func (f *filter) libraryEnds(remote netip.AddrPort) {
	f.mu.Lock()
	defer f.mu.Unlock()

	t := f.active[remote]
	if t == nil {
		return
	}

	t.closing = true

	for f.delivering == t {
		f.delivered.Wait()
	}
}

// request decides a read or write request: the normalised request to hand the library when it is admitted.
func (f *filter) request(b []byte, p packet) ([]byte, bool) {
	s := f.s

	if !f.rates.allow(p.src.Addr(), s.now()) {
		s.shed(p.src, resultRateLimited)

		return nil, false
	}

	req, err := parseRequest(b)
	if err != nil {
		f.refuse(p, resultBadRequest, errIllegalOp, "bad request", zap.Error(err))

		return nil, false
	}

	f.mu.Lock()
	closing := f.closing
	_, busy := f.active[p.src]
	overloaded := f.running >= s.cfg.MaxTransfers+s.cfg.MaxTransfers/2
	f.mu.Unlock()

	switch {
	case closing:
		return nil, false
	case busy:
		// A client that sends its request again (the first packet was slow or lost) already has its transfer.
		s.count(resultDuplicate)

		return nil, false
	case req.write:
		f.refuse(p, resultWrite, errAccessViolation, "read-only", zap.String("name", req.name))

		return nil, false
	}

	file, err := s.catalog.Lookup(req.name)
	if err != nil {
		result, code, msg := resultNotFound, errFileNotFound, "file not found"
		if errors.Is(err, bootfiles.ErrBadName) {
			result, code, msg = resultBadName, errAccessViolation, "bad name"
		}

		f.refuse(p, result, code, msg, zap.String("name", req.name), zap.Error(err))
		s.report(bootfiles.Fetch{Name: req.name, Remote: p.src.Addr(), Err: err})

		return nil, false
	}

	// An ended transfer's goroutine exits when the library reads the error handed to it: on a starved CPU
	// they could pile up, so beyond half the bound again new requests wait for them.
	if overloaded {
		s.shed(p.src, resultOverloaded, zap.String("name", file.Name))

		return nil, false
	}

	t := &transfer{remote: p.src, oob: f.sendFrom(p.dst), file: file, mode: req.mode, start: time.Now()}

	slot, err := s.lim.Acquire(p.src.Addr(), func() { f.end(t, outcomeEvicted, false) })
	if err != nil {
		result := resultTotal
		if re, ok := limits.AsRefused(err); ok && re.Reason == limits.PerSource {
			result = resultPerSource
		}

		s.shed(p.src, result, zap.String("name", file.Name))

		return nil, false
	}

	t.slot = slot

	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		slot.Release()

		return nil, false
	}

	f.active[p.src] = t
	f.running++
	f.wg.Add(1)
	f.mu.Unlock()

	f.lastAdmitted = t
	s.count(resultServed)

	f.out = req.appendNormalized(f.out[:0], f.blockLimit(p))

	return f.out, true
}

// refuse counts and logs a request refused for good and answers it with an error packet from the server
// port, while under ErrorRate; beyond it the request gets no answer. The library never sees these requests:
// it would answer each from a transfer of its own, keyed by the client's address and port, and a request
// from that address and port while the refusal is still in flight would be handed to that transfer and lost.
func (f *filter) refuse(p packet, result string, code uint16, msg string, fields ...zap.Field) {
	s := f.s
	s.note(p.src, result, fields...)

	if !s.errRate.AllowN(s.now(), 1) {
		s.errorsDropped.Inc()

		return
	}

	if _, err := f.writeFrom(appendError(nil, code, msg), p.src, f.sendFrom(p.dst)); err != nil {
		s.log.Debug("tftp error reply not sent", zap.Stringer("remote", p.src), zap.Error(err))
	}
}

// blockLimit is the largest blksize for a request that came in on p's interface: BlockSize, clamped to the
// interface MTU minus the IP and UDP headers (looked up once a minute per interface).
func (f *filter) blockLimit(p packet) int {
	limit := f.s.cfg.BlockSize
	if p.ifIndex <= 0 {
		return limit
	}

	e, ok := f.mtuCache[p.ifIndex]
	if !ok || time.Since(e.at) > time.Minute {
		e = mtuEntry{at: time.Now()}

		if ifi, err := net.InterfaceByIndex(p.ifIndex); err == nil {
			e.mtu = ifi.MTU
		}

		f.mtuCache[p.ifIndex] = e
	}

	overhead := 28 // IPv4 and UDP headers
	if p.dst.Is6() && !p.dst.Is4In6() {
		overhead = 48
	}

	if e.mtu-overhead < minBlockSize {
		return limit
	}

	return min(limit, e.mtu-overhead)
}

// end ends t from outside (eviction, shutdown): the error handed to the library ends the transfer where it
// waits for its client. wake is false when the caller is the read loop itself, which hands it over next.
func (f *filter) end(t *transfer, outcome string, wake bool) {
	f.mu.Lock()

	if t.done || t.ended != "" {
		f.mu.Unlock()

		return
	}

	t.ended = outcome
	f.ended = append(f.ended, t)
	f.nEnded.Add(1)
	f.mu.Unlock()

	if wake {
		f.wake()
	}
}

// wake interrupts the read loop's socket read so that it hands over the errors of ended transfers. The
// deadline is moved to the past before woken is set: the read loop restores the library's deadline when it
// sees woken, and then looks for ended transfers.
func (f *filter) wake() {
	_ = f.conn.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck // the read reports a broken socket

	f.woken.Store(true)

	select {
	case f.wakeCh <- struct{}{}:
	default:
	}
}

func (f *filter) popEnded() *transfer {
	f.mu.Lock()
	defer f.mu.Unlock()

	for len(f.ended) > 0 {
		t := f.ended[0]
		f.ended[0] = nil
		f.ended = f.ended[1:]
		f.nEnded.Add(-1)

		if !t.done && !t.closing && f.active[t.remote] == t {
			f.handing(t)

			return t
		}
	}

	return nil
}

// WriteTo sends the library's packet from the address the transfer's request was sent to, and fails the
// send when the transfer is to end (see outgoing).
func (f *filter) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return f.conn.WriteTo(b, addr)
	}

	ap := ua.AddrPort()
	remote := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())

	f.mu.Lock()

	t := f.active[remote]
	if t == nil {
		f.mu.Unlock()

		return f.conn.WriteTo(b, addr)
	}

	send, err := f.outgoing(t, b)
	f.mu.Unlock()

	if err != nil {
		return 0, err
	}

	if !send {
		return len(b), nil
	}

	return f.writeFrom(b, remote, t.oob)
}

// outgoing decides a packet the library sends for t (f.mu held): whether it goes out, or the error that ends
// the transfer instead. The library retransmits a packet after each Timeout, at most Retries times; the
// filter counts the sends of each packet and ends the transfer after 1+FirstRetries sends to a client that
// has acknowledged nothing (a forged source earns no more), after MaxResends resends in all, or at the first
// send after MaxTransferTime. The error the library sends when a transfer ends goes out only to a live
// client that was cut off (too slow, too many resends); one that aborted or never acknowledged gets nothing.
func (f *filter) outgoing(t *transfer, b []byte) (bool, error) {
	if len(b) < 2 {
		return true, nil
	}

	op := binary.BigEndian.Uint16(b)
	if op == opERROR {
		return t.ended == outcomeTooSlow || t.ended == outcomeResendBudget, nil
	}

	if t.ended != "" {
		return false, endedMessages[t.ended]
	}

	var block uint16 // 0 for an OACK, acknowledged as block 0 (RFC 2347)
	if op == opDATA && len(b) >= 4 {
		block = binary.BigEndian.Uint16(b[2:])
	}

	cfg := f.s.cfg

	if op == t.sentOp && block == t.sentBlock {
		t.sends++
		t.resends++

		switch {
		case !t.acked && t.sends > 1+cfg.FirstRetries:
			t.ended = outcomeTimeout
		case t.resends > cfg.MaxResends:
			t.ended = outcomeResendBudget
		}
	} else {
		t.sentOp, t.sentBlock, t.sends = op, block, 1
	}

	if t.ended == "" && time.Since(t.start) > cfg.MaxTransferTime {
		t.ended = outcomeTooSlow
	}

	if t.ended != "" {
		return false, endedMessages[t.ended]
	}

	return true, nil
}

// sendFrom returns the control message that sends from local, the address a request was sent to; nil when
// the kernel is to pick (a request to a broadcast or multicast address, or no address known).
func (f *filter) sendFrom(local netip.Addr) []byte {
	if f.uc == nil || !local.Is4() || local.IsMulticast() || local == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil
	}

	return (&ipv4.ControlMessage{Src: local.AsSlice()}).Marshal()
}

// writeFrom sends b to to, with the control message oob (see sendFrom) when not nil.
func (f *filter) writeFrom(b []byte, to netip.AddrPort, oob []byte) (int, error) {
	if f.uc != nil {
		n, _, err := f.uc.WriteMsgUDPAddrPort(b, oob, to)

		return n, err
	}

	return f.conn.WriteTo(b, net.UDPAddrFromAddrPort(to))
}

// lookup returns the admitted transfer for remote, nil if none.
func (f *filter) lookup(remote netip.AddrPort) *transfer {
	f.mu.Lock()
	defer f.mu.Unlock()

	if t := f.active[remote]; t != nil && !t.done {
		return t
	}

	return nil
}

// finish records that t's handler returned, with the library's error, and returns the transfer's outcome.
func (f *filter) finish(t *transfer, err error) string {
	f.mu.Lock()

	t.done = true
	if f.active[t.remote] == t {
		delete(f.active, t.remote)
	}

	f.running--
	ended, clientErr := t.ended, t.clientErr
	f.mu.Unlock()

	t.slot.Release()
	f.wg.Done()

	var ne net.Error

	switch {
	case err == nil:
		return outcomeOK
	case ended != "":
		return ended
	case clientErr:
		return outcomeAborted
	case errors.As(err, &ne) && ne.Timeout():
		return outcomeTimeout
	default:
		return outcomeSendFailed
	}
}

// unstarted is called (from the library's read loop, through the hook) when the library could not start a
// transfer for the datagram ReadFrom handed it last: if that was an admitted request, its admission goes.
func (f *filter) unstarted() {
	if t := f.lastAdmitted; t != nil {
		f.lastAdmitted = nil
		f.s.finished(t, f.finish(t, errors.New("transfer not started")))
	}
}

// drain stops admitting, ends the transfers whose client never acknowledged anything, gives the others grace
// to finish, and ends what is left. It returns when no transfer is in progress.
func (f *filter) drain(grace time.Duration) {
	f.mu.Lock()
	f.closing = true

	var unacked []*transfer

	for _, t := range f.active {
		if !t.acked {
			unacked = append(unacked, t)
		}
	}
	f.mu.Unlock()

	for _, t := range unacked {
		f.end(t, outcomeShutdown, true)
	}

	idle := make(chan struct{})

	go func() {
		f.wg.Wait()
		close(idle)
	}()

	timer := time.NewTimer(grace)
	defer timer.Stop()

	select {
	case <-idle:
		return
	case <-timer.C:
	}

	f.mu.Lock()
	rest := make([]*transfer, 0, len(f.active))

	for _, t := range f.active {
		rest = append(rest, t)
	}
	f.mu.Unlock()

	for _, t := range rest {
		f.end(t, outcomeShutdown, true)
	}

	<-idle
}

// stop tells ReadFrom that the library is being stopped: with nothing in progress it returns at once.
func (f *filter) stop() {
	f.mu.Lock()
	f.stopped = true
	f.halted.Store(true)
	f.mu.Unlock()

	f.wake()
}

// Close closes the socket (the library does, once it has stopped).
func (f *filter) Close() error { return f.conn.Close() }

// LocalAddr returns the socket's address.
func (f *filter) LocalAddr() net.Addr { return f.conn.LocalAddr() }

// SetDeadline sets the library's read and write deadlines.
func (f *filter) SetDeadline(t time.Time) error {
	if err := f.SetReadDeadline(t); err != nil {
		return err
	}

	return f.conn.SetWriteDeadline(t)
}

// SetReadDeadline sets the library's read deadline (the library sets one when it stops).
func (f *filter) SetReadDeadline(t time.Time) error {
	f.mu.Lock()
	f.deadline = t
	f.mu.Unlock()

	return f.conn.SetReadDeadline(t)
}

// SetWriteDeadline sets the write deadline.
func (f *filter) SetWriteDeadline(t time.Time) error { return f.conn.SetWriteDeadline(t) }

var _ net.PacketConn = (*filter)(nil)
