package tftp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/limits"
	"github.com/outpost-metal/outpost/edge/tftp"
)

// fetches records what the server reports to the journal.
type fetches struct {
	mu  sync.Mutex
	got []bootfiles.Fetch
}

func (f *fetches) TFTPFetch(x bootfiles.Fetch) {
	f.mu.Lock()
	f.got = append(f.got, x)
	f.mu.Unlock()
}

func (f *fetches) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return len(f.got)
}

type server struct {
	*tftp.Server

	addr string
	logs *observer.ObservedLogs
	obs  *fetches
}

func start(t *testing.T, cfg tftp.Config, catalog *bootfiles.Catalog) *server {
	t.Helper()

	return startOn(t, "127.0.0.1:0", cfg, catalog, nil)
}

// startOn serves on listen, with clock pacing the rates when not nil.
func startOn(t *testing.T, listen string, cfg tftp.Config, catalog *bootfiles.Catalog, clock limits.Clock) *server {
	t.Helper()

	conn, err := net.ListenPacket("udp4", listen)
	require.NoError(t, err)

	core, logs := observer.New(zapcore.InfoLevel)
	obs := &fetches{}

	srv, err := tftp.New(cfg, zap.New(core), catalog, tftp.Deps{Observer: obs, Clock: clock})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, conn) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return &server{Server: srv, addr: conn.LocalAddr().String(), logs: logs, obs: obs}
}

// frozenClock is a Clock that moves only when told; its timers never fire (the refusal log's summaries are
// written when the server stops).
type frozenClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *frozenClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *frozenClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (*frozenClock) AfterFunc(time.Duration, func()) func() bool { return func() bool { return true } }

// rrq builds a read request: the name, the mode, then option name/value pairs.
func rrq(name, mode string, opts ...string) []byte {
	b := binary.BigEndian.AppendUint16(nil, 1)
	for _, f := range append([]string{name, mode}, opts...) {
		b = append(append(b, f...), 0)
	}

	return b
}

// peer is a hand-driven client socket.
type peer struct {
	t    *testing.T
	conn *net.UDPConn
	srv  *net.UDPAddr
	tid  *net.UDPAddr // where the server answered from (its transfer's address and port), once it answered
}

func newPeer(t *testing.T, local, srv string) *peer {
	t.Helper()

	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(local)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	a, err := net.ResolveUDPAddr("udp4", srv)
	require.NoError(t, err)

	return &peer{t: t, conn: c, srv: a}
}

func (p *peer) send(b []byte) {
	p.t.Helper()

	_, err := p.conn.WriteToUDP(b, p.srv)
	require.NoError(p.t, err)
}

func (p *peer) ack(block uint16) {
	p.t.Helper()

	_, err := p.conn.WriteToUDP(binary.BigEndian.AppendUint16([]byte{0, 4}, block), p.tid)
	require.NoError(p.t, err)
}

// recv returns the next packet's opcode, its second 16-bit field (block or error code) and its sender, or
// ok=false when none arrives within d.
func (p *peer) recv(d time.Duration) (op, num uint16, from *net.UDPAddr, ok bool) {
	p.t.Helper()

	b, from, ok := p.recvPacket(d)
	if !ok {
		return 0, 0, nil, false
	}

	return binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:]), from, true
}

// recvPacket returns the next packet and its sender, or ok=false when none arrives within d.
func (p *peer) recvPacket(d time.Duration) ([]byte, *net.UDPAddr, bool) {
	p.t.Helper()

	require.NoError(p.t, p.conn.SetReadDeadline(time.Now().Add(d)))

	b := make([]byte, 70000)

	n, from, err := p.conn.ReadFromUDP(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, nil, false
	}

	require.NoError(p.t, err)
	require.GreaterOrEqual(p.t, n, 4)

	if p.tid == nil {
		p.tid = from
	}

	return b[:n], from, true
}

const (
	opDATA  = 3
	opERROR = 5
	opOACK  = 6
)

func fastConfig() tftp.Config {
	cfg := tftp.Default()
	cfg.Timeout = 100 * time.Millisecond

	return cfg
}

func bigCatalog() *bootfiles.Catalog {
	return bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": make([]byte, 100_000)})
}

func TestNeverAcknowledgingClientGetsFewSends(t *testing.T) {
	t.Parallel()

	srv := start(t, fastConfig(), bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	p.send(rrq("ipxe.efi", "octet"))

	// DATA 1 once and FirstRetries (2) times again, then nothing.
	for range 3 {
		op, block, _, ok := p.recv(5 * time.Second)
		require.True(t, ok)
		require.Equal(t, uint16(opDATA), op)
		require.Equal(t, uint16(1), block)
	}

	require.Eventually(t, func() bool { return srv.TransferCount("timeout") == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, srv.Stats().Held)

	_, _, _, more := p.recv(300 * time.Millisecond)
	require.False(t, more, "a fourth send to a client that never answered")
}

func TestAcknowledgingClientGetsRetries(t *testing.T) {
	t.Parallel()

	srv := start(t, fastConfig(), bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	p.send(rrq("ipxe.efi", "octet", "blksize", "1024", "tsize", "0"))

	op, _, _, ok := p.recv(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opOACK), op)
	p.ack(0)

	// The client acknowledged once, then went quiet: block 1 is sent 1 + Retries (4) times.
	for range 5 {
		op, block, _, ok := p.recv(5 * time.Second)
		require.True(t, ok)
		require.Equal(t, uint16(opDATA), op)
		require.Equal(t, uint16(1), block)
	}

	require.Eventually(t, func() bool { return srv.TransferCount("timeout") == 1 }, 5*time.Second, time.Millisecond)
}

func TestSlowClientIsCutOff(t *testing.T) {
	t.Parallel()

	cfg := fastConfig()
	cfg.MaxTransferTime = 300 * time.Millisecond
	srv := start(t, cfg, bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	p.send(rrq("ipxe.efi", "octet"))

	// Acknowledges every block only when it comes the second time: one timeout per block.
	seen := map[uint16]bool{}

	for {
		op, num, _, ok := p.recv(5 * time.Second)
		require.True(t, ok, "the slow transfer was never ended")

		if op == opERROR {
			break
		}

		require.Equal(t, uint16(opDATA), op)

		if seen[num] {
			p.ack(num)
		}

		seen[num] = true
	}

	require.Eventually(t, func() bool { return srv.TransferCount("too_slow") == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return srv.logs.FilterField(zap.String("reason", "too_slow")).Len() == 1 }, 5*time.Second, time.Millisecond)
}

func TestDuplicateRequestIsOneTransfer(t *testing.T) {
	t.Parallel()

	srv := start(t, fastConfig(), bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	p.send(rrq("ipxe.efi", "octet"))
	p.send(rrq("ipxe.efi", "octet"))

	require.Eventually(t, func() bool { return srv.RequestCount("duplicate") == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, srv.RequestCount("served"))
	require.Equal(t, 1, srv.Stats().Held)
}

func TestTsizeProbeAbortFreesTheTransfer(t *testing.T) {
	t.Parallel()

	srv := start(t, fastConfig(), bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	// EDK2 asks for the size, then aborts with an error before downloading.
	p.send(rrq("ipxe.efi", "octet", "tsize", "0"))

	op, _, _, ok := p.recv(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opOACK), op)

	_, err := p.conn.WriteToUDP(append([]byte{0, 5, 0, 8}, "size only\x00"...), p.tid)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return srv.TransferCount("aborted_by_client") == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, srv.Stats().Held)
	require.Zero(t, srv.obs.len(), "a probe is not a fetch")
}

func TestPerSourceBoundEvictsTheSourcesOwnUnacknowledged(t *testing.T) {
	t.Parallel()

	cfg := fastConfig()
	cfg.Timeout = 5 * time.Second // nothing times out during the test
	cfg.MaxTransfersPerSource = 2
	srv := start(t, cfg, bigCatalog())

	first := newPeer(t, "127.0.0.5", srv.addr)
	first.send(rrq("ipxe.efi", "octet"))
	_, _, _, ok := first.recv(5 * time.Second)
	require.True(t, ok)

	for range 2 {
		p := newPeer(t, "127.0.0.5", srv.addr)
		p.send(rrq("ipxe.efi", "octet"))
		_, _, _, ok := p.recv(5 * time.Second)
		require.True(t, ok)
	}

	require.Eventually(t, func() bool { return srv.TransferCount("evicted") == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 2, srv.Stats().Held)
	require.Equal(t, int64(1), srv.Stats().Evicted[limits.PerSource])

	_, _, _, more := first.recv(300 * time.Millisecond)
	require.False(t, more, "the evicted transfer's client got another packet")
}

func TestBoundReachedByAcknowledgedTransfersLeavesTheRequestForItsRetry(t *testing.T) {
	t.Parallel()

	cfg := fastConfig()
	cfg.Timeout = time.Second // nothing times out during the test
	cfg.MaxTransfers = 2
	cfg.MaxTransfersPerSource = 2
	srv := start(t, cfg, bigCatalog())

	// Two clients that acknowledged their first block, then take their time.
	var busy []*peer

	for _, local := range []string{"127.0.0.6", "127.0.0.7"} {
		p := newPeer(t, local, srv.addr)
		p.send(rrq("ipxe.efi", "octet"))
		_, _, _, ok := p.recv(5 * time.Second)
		require.True(t, ok)
		p.ack(1)
		_, _, _, ok = p.recv(5 * time.Second)
		require.True(t, ok)

		busy = append(busy, p)
	}

	// A third request is counted, logged with what to do, and not answered: an error would end the ROM's boot.
	third := newPeer(t, "127.0.0.8", srv.addr)
	third.send(rrq("ipxe.efi", "octet"))

	require.Eventually(t, func() bool { return srv.RequestCount("refused_total") == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return srv.logs.FilterField(zap.String("reason", "refused_total")).Len() == 1 }, 5*time.Second, time.Millisecond)

	line := srv.logs.FilterField(zap.String("reason", "refused_total")).All()[0].ContextMap()
	require.Contains(t, line["hint"], "--tftp-max-transfers")
	require.Contains(t, line["remote"], "127.0.0.8:")

	_, _, _, answered := third.recv(100 * time.Millisecond)
	require.False(t, answered)

	// One of the busy clients aborts; the third one's retransmitted request is served.
	_, err := busy[0].conn.WriteToUDP([]byte{0, 5, 0, 0, 0}, busy[0].tid)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return srv.Stats().Held == 1 }, 5*time.Second, time.Millisecond)

	third.send(rrq("ipxe.efi", "octet"))

	op, block, _, ok := third.recv(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opDATA), op)
	require.Equal(t, uint16(1), block)
}

func TestRefusalFloodIsBoundedInRepliesEventsAndLogLines(t *testing.T) {
	t.Parallel()

	cfg := fastConfig()
	cfg.ErrorRate = 50
	cfg.EventRate = 10
	cfg.RequestRatePerSource = 1_000_000 // one address sends them all; TestRequestRatePerSource bounds that
	srv := start(t, cfg, bigCatalog())

	p := newPeer(t, "127.0.0.9", srv.addr)

	// Drain replies while flooding.
	var replies int

	got := make(chan int)

	go func() {
		n := 0

		b := make([]byte, 2048)

		for {
			_ = p.conn.SetReadDeadline(time.Now().Add(time.Second))

			if _, _, err := p.conn.ReadFromUDP(b); err != nil {
				got <- n

				return
			}

			n++
		}
	}()

	const flood = 3000

	begin := time.Now()

	// In bursts of 100 the socket buffer holds, so that every request reaches the server.
	for i := range flood {
		p.send(rrq("missing-"+string(rune('a'+i%26)), "octet"))

		if i%100 == 99 {
			require.Eventually(t, func() bool { return srv.RequestCount("not_found") == i+1 }, 10*time.Second, 100*time.Microsecond)
		}
	}

	elapsed := time.Since(begin).Seconds()
	replies = <-got

	errDropped, evDropped := srv.DroppedCounts()
	t.Logf("%d refused requests in %.2fs: %d error replies (%d left out), %d journal events (%d left out), %d log lines",
		flood, elapsed, replies, errDropped, srv.obs.len(), evDropped, srv.logs.Len())

	require.LessOrEqual(t, float64(replies), 50+50*elapsed+1)
	require.Equal(t, flood, replies+errDropped)
	require.LessOrEqual(t, float64(srv.obs.len()), 10+10*elapsed+1)
	require.Equal(t, flood, srv.obs.len()+evDropped)
	require.Len(t, srv.logs.FilterField(zap.String("reason", "not_found")).All(), 1, "one line until the interval ends")
}

func TestRequestRatePerSource(t *testing.T) {
	t.Parallel()

	cfg := fastConfig()
	cfg.RequestRatePerSource = 5 // bursts of 10
	clock := &frozenClock{now: time.Unix(1_700_000_000, 0)}
	srv := startOn(t, "127.0.0.1:0", cfg, bigCatalog(), clock)

	p := newPeer(t, "127.0.0.11", srv.addr)

	for range 15 {
		p.send(rrq("missing.efi", "octet"))
	}

	require.Eventually(t, func() bool { return srv.RequestCount("not_found")+srv.RequestCount("rate_limited") == 15 },
		5*time.Second, time.Millisecond)
	require.Equal(t, 10, srv.RequestCount("not_found"))
	require.Equal(t, 5, srv.RequestCount("rate_limited"))

	for range 10 {
		op, _, _, ok := p.recv(5 * time.Second)
		require.True(t, ok)
		require.Equal(t, uint16(opERROR), op)
	}

	_, _, _, more := p.recv(200 * time.Millisecond)
	require.False(t, more, "a request beyond the rate was answered")

	// A second later the address has 5 more; another address was never limited.
	clock.Advance(time.Second)

	for range 6 {
		p.send(rrq("missing.efi", "octet"))
	}

	other := newPeer(t, "127.0.0.12", srv.addr)
	other.send(rrq("ipxe.efi", "octet"))

	op, block, _, ok := other.recv(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opDATA), op)
	require.Equal(t, uint16(1), block)

	require.Eventually(t, func() bool { return srv.RequestCount("not_found") == 15 && srv.RequestCount("rate_limited") == 6 },
		5*time.Second, time.Millisecond)
}

func TestOptionNamesAreCaseInsensitive(t *testing.T) {
	t.Parallel()

	srv := start(t, fastConfig(), bigCatalog())
	p := newPeer(t, "127.0.0.1", srv.addr)

	p.send(rrq("ipxe.efi", "OCTET", "BLKSIZE", "1024", "TSize", "0"))

	b, _, ok := p.recvPacket(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opOACK), binary.BigEndian.Uint16(b))

	opts := map[string]string{}
	fields := strings.Split(string(b[2:]), "\x00")

	for i := 0; i+1 < len(fields); i += 2 {
		opts[fields[i]] = fields[i+1]
	}

	require.Equal(t, map[string]string{"blksize": "1024", "tsize": "100000"}, opts)

	p.ack(0)

	b, _, ok = p.recvPacket(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(opDATA), binary.BigEndian.Uint16(b))
	require.Len(t, b, 4+1024)
}

// TestRepliesComeFromTheAddressAsked serves on the wildcard address: a request sent to 127.0.0.3 is answered
// from 127.0.0.3 (EDK2 takes its server's packets only from the address it asked), whether it is served or
// refused.
func TestRepliesComeFromTheAddressAsked(t *testing.T) {
	t.Parallel()

	srv := startOn(t, "0.0.0.0:0", fastConfig(), bigCatalog(), nil)
	_, port, err := net.SplitHostPort(srv.addr)
	require.NoError(t, err)

	asked := net.JoinHostPort("127.0.0.3", port)

	for _, name := range []string{"ipxe.efi", "missing.efi"} {
		p := newPeer(t, "127.0.0.1", asked)
		p.send(rrq(name, "octet"))

		_, _, from, ok := p.recv(5 * time.Second)
		require.True(t, ok)
		require.Equal(t, asked, from.String(), name)
	}
}

func TestShutdownEndsTransfers(t *testing.T) {
	t.Parallel()

	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)

	cfg := tftp.Default()
	cfg.Timeout = time.Second // grace 2 s; an acknowledged client would time out by itself after 5 s, one that never acknowledged after 3 s

	srv, err := tftp.New(cfg, zap.NewNop(), bigCatalog(), tftp.Deps{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, conn) }()

	addr := conn.LocalAddr().String()

	acked := newPeer(t, "127.0.0.13", addr)
	acked.send(rrq("ipxe.efi", "octet"))
	_, _, _, ok := acked.recv(5 * time.Second)
	require.True(t, ok)
	acked.ack(1)
	_, block, _, ok := acked.recv(5 * time.Second)
	require.True(t, ok)
	require.Equal(t, uint16(2), block)

	unacked := newPeer(t, "127.0.0.14", addr)
	unacked.send(rrq("ipxe.efi", "octet"))
	_, _, _, ok = unacked.recv(5 * time.Second)
	require.True(t, ok)

	cancel()

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}

	require.Equal(t, 2, srv.TransferCount("shutdown"), "both ended by the shutdown, not by their timeouts")
	require.Zero(t, srv.Stats().Held)
}

func TestSourceRatesForgetTheLeastRecent(t *testing.T) {
	t.Parallel()

	allow, size := tftp.SourceRates(1, 2, 3)
	now := time.Unix(1_700_000_000, 0)
	a := netip.MustParseAddr("10.0.0.1")

	require.True(t, allow(a, now))
	require.True(t, allow(a, now))
	require.False(t, allow(a, now), "beyond the burst")
	require.True(t, allow(a, now.Add(time.Second)), "one a second")
	require.False(t, allow(a, now.Add(time.Second)))

	// Three others fill the table: a is forgotten, and starts again with a full bucket.
	for _, s := range []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"} {
		require.True(t, allow(netip.MustParseAddr(s), now.Add(time.Second)))
	}

	require.Equal(t, 3, size())
	require.True(t, allow(a, now.Add(time.Second)))
	require.True(t, allow(a, now.Add(time.Second)))
	require.False(t, allow(a, now.Add(time.Second)))
	require.Equal(t, 3, size())
}
