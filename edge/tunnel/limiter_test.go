package tunnel_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/metal"
)

// fakeClock is a limits.Clock moved by hand; due timers run inside Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()

	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)

	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()

		was := !t.stopped
		t.stopped = true

		return was
	}
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)

	var due []*fakeTimer

	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			t.stopped = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()

	for _, t := range due {
		t.f()
	}
}

func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)

	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

type limitHarness struct {
	srv  *tunnel.Server
	addr string
	ev   *events
	logs *observer.ObservedLogs
}

func newLimitHarness(t *testing.T, l tunnel.Limits, clock *fakeClock) *limitHarness {
	t.Helper()

	ev := &events{}
	core, logs := observer.New(zapcore.InfoLevel)
	opts := tunnel.Options{Logger: zap.New(core), Events: ev, Limits: l, Binding: tunnel.BindOff}

	if clock != nil {
		opts.Clock = clock
	}

	srv := tunnel.New(opts)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return &limitHarness{srv: srv, addr: ln.Addr().String(), ev: ev, logs: logs}
}

// dialFrom is a client connection to addr from a local loopback address.
func dialFrom(t *testing.T, local, addr string) *grpc.ClientConn {
	t.Helper()

	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}

			return d.DialContext(ctx, "tcp", a)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })

	return conn
}

// openOn opens a reverse tunnel for a random machine on conn; the returned channel gets Serve's error when
// the tunnel ends (at once when refused). Cancel closes it.
func openOn(t *testing.T, conn *grpc.ClientConn) (cancel func(), done <-chan error) {
	t.Helper()

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(rts, &fakeAgent{})

	ctx, cancelCtx := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), metal.MetadataKey, randomUUID()))
	errCh := make(chan error, 1)

	go func() {
		_, err := rts.Serve(ctx)
		errCh <- err
	}()

	var once sync.Once

	stop := func() {
		once.Do(func() {
			cancelCtx()
			rts.Stop()
		})
	}

	t.Cleanup(stop)

	return stop, errCh
}

func requireRefused(t *testing.T, done <-chan error) {
	t.Helper()

	select {
	case err := <-done:
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("tunnel over the limit was not refused")
	}
}

func limitsFor(total, perSource, perConn int) tunnel.Limits {
	l := tunnel.DefaultLimits()
	l.MaxTunnels, l.MaxTunnelsPerSource, l.MaxTunnelsPerConn = total, perSource, perConn

	return l
}

func TestTunnelLimits(t *testing.T) {
	t.Parallel()

	h := newLimitHarness(t, limitsFor(4, 2, 1), nil)
	held := func() int { tun, _ := h.srv.LimitStats(); return tun.Held }

	// Per connection: the second tunnel on one connection is refused.
	a := dialFrom(t, "127.0.0.21", h.addr)
	openOn(t, a)
	require.Eventually(t, func() bool { return held() == 1 }, 5*time.Second, time.Millisecond)

	_, done := openOn(t, a)
	requireRefused(t, done)

	// Per source: a second connection from that address is fine, a third is not.
	openOn(t, dialFrom(t, "127.0.0.21", h.addr))
	require.Eventually(t, func() bool { return held() == 2 }, 5*time.Second, time.Millisecond)

	_, done = openOn(t, dialFrom(t, "127.0.0.21", h.addr))
	requireRefused(t, done)

	// In total: two more from other addresses, then none.
	openOn(t, dialFrom(t, "127.0.0.22", h.addr))
	openOn(t, dialFrom(t, "127.0.0.23", h.addr))
	require.Eventually(t, func() bool { return held() == 4 }, 5*time.Second, time.Millisecond)

	_, done = openOn(t, dialFrom(t, "127.0.0.24", h.addr))
	requireRefused(t, done)

	tun, _ := h.srv.LimitStats()
	require.Equal(t, int64(1), tun.Refused["per_source"])
	require.Equal(t, int64(1), tun.Refused["total"])

	for _, reason := range []string{"per_connection", "per_source", "total"} {
		lines := h.logs.FilterMessage("agent tunnel refused").FilterField(zap.String("reason", reason)).All()
		require.Len(t, lines, 1, reason)
		require.NotEmpty(t, lines[0].ContextMap()["hint"])
	}

	require.Eventually(t, func() bool { o, _ := h.ev.counts(); return o == 4 }, 5*time.Second, time.Millisecond)
	require.Never(t, func() bool { o, _ := h.ev.counts(); return o > 4 }, 50*time.Millisecond, 5*time.Millisecond, "refused tunnels are not journaled")
}

func TestTunnelEventsCoalesceOverTheBudget(t *testing.T) {
	t.Parallel()

	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	l := limitsFor(100, 100, 100)
	l.EventRate, l.EventBurst = 1, 2
	h := newLimitHarness(t, l, clock)

	conn := dialFrom(t, "127.0.0.31", h.addr)

	var stops []func()

	for range 5 {
		stop, _ := openOn(t, conn)
		stops = append(stops, stop)
	}

	held := func() int { tun, _ := h.srv.LimitStats(); return tun.Held }
	require.Eventually(t, func() bool { return held() == 5 }, 5*time.Second, time.Millisecond)

	// The burst (2) passed at once; 3 are held back.
	require.Eventually(t, func() bool { passed, _, _, back := h.srv.GateCounts(); return passed == 2 && back == 3 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { o, _ := h.ev.counts(); return o == 2 }, 5*time.Second, time.Millisecond)

	// Close everything: the 2 journaled opens get their closes, the 3 held back vanish (coalesced).
	for _, stop := range stops {
		stop()
	}

	require.Eventually(t, func() bool { return held() == 0 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { _, c := h.ev.counts(); return c == 2 }, 5*time.Second, time.Millisecond)

	clock.Advance(time.Minute)

	opened, closed := h.ev.counts()
	require.Equal(t, 2, opened, "coalesced opens are never journaled")
	require.Equal(t, 2, closed)
	_, _, coalesced, _ := h.srv.GateCounts()
	require.Equal(t, int64(3), coalesced)
	require.Len(t, h.logs.FilterField(zap.String("reason", "coalesced")).All(), 2, "one line at once, one summary")
}

func TestTunnelEventHeldBackIsJournaledLate(t *testing.T) {
	t.Parallel()

	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	l := limitsFor(100, 100, 100)
	l.EventRate, l.EventBurst = 1, 1
	h := newLimitHarness(t, l, clock)

	conn := dialFrom(t, "127.0.0.32", h.addr)
	openOn(t, conn)
	openOn(t, conn)

	require.Eventually(t, func() bool { passed, _, _, back := h.srv.GateCounts(); return passed == 1 && back == 1 }, 5*time.Second, time.Millisecond)

	// A second later the budget has a token: the held-back open of a tunnel still open is journaled.
	clock.Advance(time.Second)
	require.Eventually(t, func() bool { o, _ := h.ev.counts(); return o == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, h.logs.FilterMessage("agent tunnel opened").FilterField(zap.Bool("late", true)).Len())
}

func TestAPIConnectionLimit(t *testing.T) {
	t.Parallel()

	l := tunnel.DefaultLimits()
	l.MaxConnsPerSource = 2
	h := newLimitHarness(t, l, nil)

	var conns []net.Conn

	for range 2 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 41)}}).Dial("tcp", h.addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		conns = append(conns, c)
	}

	require.Eventually(t, func() bool { _, c := h.srv.LimitStats(); return c.Held == 2 }, 5*time.Second, time.Millisecond)

	// Both have heard the server's HTTP/2 settings: written to, they are no longer evictable (a connection the
	// server has not yet answered may be displaced by a newer one from its source instead of the newer one
	// being refused; on a busy machine the third dial could otherwise arrive first).
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))

		_, err := io.ReadFull(c, make([]byte, 9)) // a frame header
		require.NoError(t, err)
	}

	// The third connection from that address is reset at once.
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 41)}}).Dial("tcp", h.addr)
	if err == nil {
		defer c.Close()

		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))

		for {
			if _, err = c.Read(make([]byte, 64)); err != nil {
				break
			}
		}
	}

	require.Eventually(t, func() bool { _, c := h.srv.LimitStats(); return c.Refused["per_source"] == 1 }, 5*time.Second, time.Millisecond)
	require.Len(t, conns, 2)
}
