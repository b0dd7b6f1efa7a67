package tftp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/limits"
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

// transfer is one read transfer: its own socket (the server's TID), lock-step DATA and ACK (RFC 1350),
// after an OACK when the client asked for options (RFC 2347).
type transfer struct {
	s      *Server
	remote netip.AddrPort
	name   string
	start  time.Time
	conn   *net.UDPConn
	slot   *limits.Slot

	data    []byte
	blksize int
	oack    []byte // nil when no option is acknowledged
	rbuf    []byte

	// ended is the outcome set by whoever ended the transfer from outside (eviction, shutdown).
	ended atomic.Pointer[string]
	// acked is set once the client acknowledged a packet: the transfer is then no longer evictable and
	// gets Retries instead of FirstRetries.
	acked atomic.Bool
}

// open creates the transfer's socket on the address the request was sent to (any address when unknown).
func (t *transfer) open(local netip.Addr) error {
	laddr := &net.UDPAddr{}
	if local.IsValid() && !local.IsMulticast() && local != netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		laddr.IP = local.AsSlice()
	}

	network := "udp"
	if t.remote.Addr().Is4() {
		network = "udp4"
	}

	c, err := net.ListenUDP(network, laddr)
	if err != nil {
		return fmt.Errorf("open transfer socket: %w", err)
	}

	t.conn = c

	return nil
}

// prepare decides the options: blksize up to limit, tsize when asked (in netascii, the converted size).
func (t *transfer) prepare(req Request, f *File, limit int) {
	t.data = f.Data
	if req.Mode == "netascii" {
		t.data = netasciiOf(f.Data)
	}

	t.blksize = minBlockSize

	blk := req.BlockSize(limit)
	if blk > 0 {
		t.blksize = blk
	}

	size := int64(-1)
	if req.WantsSize() {
		size = int64(len(t.data))
	}

	if blk > 0 || size >= 0 {
		t.oack = appendOACK(nil, blk, size)
	}
}

// end ends the transfer from outside: its socket is closed and its goroutine stops at once.
func (t *transfer) end(outcome string) {
	if t.ended.CompareAndSwap(nil, &outcome) {
		t.conn.Close() //nolint:errcheck,gosec // ends the transfer's read
	}
}

func (t *transfer) run() {
	s := t.s

	outcome, err := t.send()

	t.conn.Close() //nolint:errcheck,gosec // done
	t.slot.Release()

	s.mu.Lock()
	if s.active[t.remote] == t {
		delete(s.active, t.remote)
	}
	s.mu.Unlock()

	s.transfers.WithLabelValues(outcome).Inc()

	fields := []zap.Field{
		zap.String("name", t.name), zap.Stringer("remote", t.remote), zap.String("outcome", outcome),
		zap.Duration("took", time.Since(t.start)),
	}

	switch outcome {
	case outcomeOK:
		s.nServed.Add(1)
		s.log.Debug("tftp transfer done", fields...)

		if s.deps.Observer != nil {
			s.deps.Observer.TFTPFetch(Fetch{Name: t.name, Remote: t.remote.Addr()})
		}
	case outcomeTooSlow, outcomeResendBudget:
		s.rejects.Note(outcome, append(fields, zap.String("hint", s.hints[outcome]))...)
	default:
		// EDK2 asks for tsize and aborts before downloading; forged or vanished clients time out: normal.
		s.log.Debug("tftp transfer ended early", append(fields, zap.Error(err))...)
	}

	s.running.Add(-1)
	s.wg.Done()
}

// send runs the transfer and returns its outcome.
func (t *transfer) send() (string, error) {
	s := t.s
	deadline := t.start.Add(s.cfg.MaxTransferTime)
	resends := 0

	exchange := func(pkt []byte, block uint16) (string, error) {
		for attempt := 0; ; attempt++ {
			if _, err := t.conn.WriteToUDPAddrPort(pkt, t.remote); err != nil {
				return t.outcome(outcomeSendFailed), fmt.Errorf("send block %d: %w", block, err)
			}

			until := time.Now().Add(s.cfg.Timeout)
			if until.After(deadline) {
				until = deadline
			}

			outcome, err := t.await(block, until)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return outcome, err
			}

			retries := s.cfg.FirstRetries
			if t.acked.Load() {
				retries = s.cfg.Retries
			}

			switch {
			case !time.Now().Before(deadline):
				t.fail(outcomeTooSlow)

				return outcomeTooSlow, fmt.Errorf("block %d: transfer took longer than %s", block, s.cfg.MaxTransferTime)
			case attempt >= retries:
				return outcomeTimeout, fmt.Errorf("block %d: no acknowledgement after %d sends", block, attempt+1)
			case resends >= s.cfg.MaxResends:
				t.fail(outcomeResendBudget)

				return outcomeResendBudget, fmt.Errorf("block %d: %d packets sent again", block, resends)
			}

			resends++
		}
	}

	if t.oack != nil {
		if outcome, err := exchange(t.oack, 0); outcome != "" {
			return outcome, err
		}
	}

	pkt := make([]byte, 0, 4+t.blksize)

	for n := 1; ; n++ {
		off := (n - 1) * t.blksize
		end := min(off+t.blksize, len(t.data))

		// Block numbers wrap after 65535 (what tftp-hpa and the ROMs do); the binaries are far smaller anyway.
		block := uint16(n) //nolint:gosec // the wrap is intended

		pkt = appendData(pkt[:0], block, t.data[off:end])

		if outcome, err := exchange(pkt, block); outcome != "" {
			return outcome, err
		}

		if end-off < t.blksize {
			return outcomeOK, nil
		}
	}
}

// await reads the transfer's socket until the client acknowledges block (outcome ""), sends an error, or
// until passes (os.ErrDeadlineExceeded). Datagrams from other addresses or ports, duplicate acknowledgements
// and anything else are ignored: a packet is sent again only on the timeout (no Sorcerer's Apprentice).
func (t *transfer) await(block uint16, until time.Time) (string, error) {
	if err := t.conn.SetReadDeadline(until); err != nil {
		return t.outcome(outcomeSendFailed), fmt.Errorf("set deadline: %w", err)
	}

	if t.rbuf == nil {
		t.rbuf = make([]byte, 1024)
	}

	buf := t.rbuf

	for {
		n, from, err := t.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && t.ended.Load() == nil {
				return "", err
			}

			return t.outcome(outcomeSendFailed), fmt.Errorf("read acknowledgement: %w", err)
		}

		if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != t.remote {
			continue
		}

		r, ok := parseReply(buf[:n])

		switch {
		case !ok:
			continue
		case !r.ack:
			return outcomeAborted, fmt.Errorf("client error %d: %q", r.errCode, r.errMsg)
		case r.block != block:
			continue
		}

		if !t.acked.Swap(true) {
			t.slot.SetEvictable(false)
		}

		return "", nil
	}
}

// outcome is the outcome set from outside when there is one (an eviction closes the socket), else fallback.
func (t *transfer) outcome(fallback string) string {
	if o := t.ended.Load(); o != nil {
		return *o
	}

	return fallback
}

// fail tells a live but slow client why its transfer ends.
func (t *transfer) fail(outcome string) {
	msg := "too slow"
	if outcome == outcomeResendBudget {
		msg = "too many resends"
	}

	_, _ = t.conn.WriteToUDPAddrPort(appendError(nil, errNotDefined, msg), t.remote) //nolint:errcheck // best effort
}
