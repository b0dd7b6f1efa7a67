package tunnel_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// floodEnv names the variable that turns a run of this test binary into a tunnel-flood process.
const floodEnv = "OUTPOST_TEST_TUNNEL_FLOOD"

// TestTunnelFloodProcess is not a test: started by TestTunnelFlood with floodEnv set to
// "<target> <tunnels> <addresses>", it opens that many reverse tunnels with random machine IDs, each on its own
// connection, from that many addresses in 127.5.0.0/16, holds them until its standard input closes, and prints
// "refused=<n> unavailable=<n> ended=<n>" twice a second (refused: the tunnel got ResourceExhausted;
// unavailable: its connection was reset at once; ended: any other end).
func TestTunnelFloodProcess(t *testing.T) {
	spec := os.Getenv(floodEnv)
	if spec == "" {
		t.Skip("helper process for TestTunnelFlood")
	}

	var (
		target           string
		tunnels, sources int
	)

	_, err := fmt.Sscan(spec, &target, &tunnels, &sources)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())

	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	var refused, unavailable, ended atomic.Int64

	report := func() {
		fmt.Printf("refused=%d unavailable=%d ended=%d\n", refused.Load(), unavailable.Load(), ended.Load())
	}

	var wg sync.WaitGroup

	for i := range tunnels {
		local := net.IPv4(127, 5, byte(i%sources/250), byte(1+i%sources%250))

		conn, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: local}}).DialContext(ctx, "tcp", a)
			}))
		require.NoError(t, err)

		rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
		agentpb.RegisterAgentServiceServer(rts, &fakeAgent{})

		wg.Go(func() {
			defer conn.Close()

			_, err := rts.Serve(metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, randomUUID()))
			switch status.Code(err) {
			case codes.ResourceExhausted:
				refused.Add(1)
			case codes.Unavailable:
				unavailable.Add(1)
			default:
				ended.Add(1)
			}
		})
	}

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()

	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			report()
		}
	}

	wg.Wait()
	report()
}

// flood is a running tunnel-flood process.
type flood struct {
	mu                          sync.Mutex
	refused, unavailable, ended int
	stdin                       io.Closer
	done                        chan struct{}
	started                     time.Time
}

func startFlood(t *testing.T, target string, tunnels, sources int) *flood {
	t.Helper()

	cmd := exec.Command(os.Args[0], "-test.run=^TestTunnelFloodProcess$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", floodEnv, target, tunnels, sources))
	cmd.Stderr = os.Stderr

	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)

	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	f := &flood{stdin: stdin, done: make(chan struct{}), started: time.Now()}

	go func() {
		defer close(f.done)

		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r, u, e int
			if _, err := fmt.Sscanf(sc.Text(), "refused=%d unavailable=%d ended=%d", &r, &u, &e); err == nil {
				f.mu.Lock()
				f.refused, f.unavailable, f.ended = r, u, e
				f.mu.Unlock()
			}
		}

		_ = cmd.Wait()
	}()

	t.Cleanup(f.stop)

	return f
}

// refused returns the tunnels refused and the connections reset, as the flood saw them.
func (f *flood) refusedCounts() (tunnels, conns int) {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.refused, f.unavailable
}

// stop closes every tunnel of the flood and waits for its process to end.
func (f *flood) stop() {
	f.mu.Lock()
	if f.stdin != nil {
		f.stdin.Close()
		f.stdin = nil
	}
	f.mu.Unlock()

	<-f.done
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}

	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))

			return float64(kb) / 1024
		}
	}

	return -1
}

// TestTunnelFlood is the tunnel attack: 2,000 reverse tunnels with random machine IDs, each on its own
// connection, from a separate process (so this process's figures are the server's). From one address, all but
// MaxTunnelsPerSource are refused; from 500 addresses, all beyond MaxTunnels (1,000 here, to see the bound with
// 2,000) are. The journal gets at most EventBurst opens at once and EventRate a second after, each journaled
// open gets its close, the rest are coalesced away; a real agent still connects while the one-address flood runs.
func TestTunnelFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("attack test: skipped under -short")
	}

	const attempts = 2000

	for _, tc := range []struct {
		name       string
		sources    int
		maxTunnels int
		want       int // tunnels the server keeps
		legit      bool
	}{
		{name: "one address", sources: 1, maxTunnels: 4096, want: 4, legit: true},
		{name: "500 addresses", sources: 500, maxTunnels: 1000, want: 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tunnel.DefaultLimits()
			l.MaxTunnels = tc.maxTunnels

			ev := &events{}
			core, _ := observer.New(zapcore.WarnLevel)
			srv := tunnel.New(tunnel.Options{Logger: zap.New(core), Events: ev, Limits: l, Binding: tunnel.BindOff})

			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)

			go func() { done <- srv.Serve(ctx, ln) }()

			t.Cleanup(func() {
				cancel()
				require.NoError(t, <-done)
			})

			runtime.GC()
			g0, rss0 := runtime.NumGoroutine(), rssMiB()

			fl := startFlood(t, ln.Addr().String(), attempts, tc.sources)

			require.Eventually(t, func() bool {
				tun, _ := srv.LimitStats()
				tunnels, conns := fl.refusedCounts()

				return tun.Held == tc.want && tunnels+conns == attempts-tc.want
			}, 2*time.Minute, 10*time.Millisecond, "the flood did not settle at the bound")

			elapsed := time.Since(fl.started)
			tun, conns := srv.LimitStats()
			keptAtPeak := tun.Held
			g1, rss1 := runtime.NumGoroutine(), rssMiB()
			opened, _ := ev.counts()
			passed, late, _, heldBack := srv.GateCounts()

			var (
				legitOpen time.Duration
				legit     int // the real agent's tunnel, still open at the end
			)

			if tc.legit {
				legit = 1
				begin := time.Now()
				connect(t, ln.Addr().String(), &fakeAgent{}, metal.MetadataKey, machineA)
				require.Eventually(t, func() bool { return srv.Connected(machineA) }, 10*time.Second, time.Millisecond,
					"a real agent could not connect during the flood")

				legitOpen = time.Since(begin)
			}

			fl.stop()
			require.Eventually(t, func() bool { tun, _ := srv.LimitStats(); return tun.Held == legit }, time.Minute, 10*time.Millisecond)
			require.Eventually(t, func() bool { o, c := ev.counts(); return o == c+legit }, time.Minute, 10*time.Millisecond,
				"every journaled open gets its close")

			o, c := ev.counts()
			_, _, coalesced, _ := srv.GateCounts()

			t.Logf("%d tunnels with random machine IDs from %d addresses, each on its own connection, settled in %s: %d kept; %d tunnels refused (per source %d, total %d), %d connections reset at once (per source %d, total %d); connections peak %d",
				attempts, tc.sources, elapsed.Round(time.Millisecond), keptAtPeak, tun.Refused["per_source"]+tun.Refused["total"],
				tun.Refused["per_source"], tun.Refused["total"], conns.Refused["per_source"]+conns.Refused["total"],
				conns.Refused["per_source"], conns.Refused["total"], conns.Peak)
			t.Logf("server process: goroutines %d before, %d with the flood held; RSS %.0f MiB before, %.0f MiB (%.0f KiB per kept tunnel)",
				g0, g1, rss0, rss1, (rss1-rss0)*1024/float64(keptAtPeak))
			t.Logf("journal: %d opens when the flood settled (%d passed, %d late, %d held back); after the flood closed: %d opens, %d closes, %d coalesced away",
				opened, passed, late, heldBack, o, c, coalesced)

			if tc.legit {
				t.Logf("a real agent's tunnel during the flood: open in %s", legitOpen.Round(time.Millisecond))
			}

			require.LessOrEqual(t, float64(passed), float64(l.EventBurst)+l.EventRate*elapsed.Seconds()+1, "journal opens over the budget")
			require.Equal(t, tc.want, o-legit+int(coalesced), "every kept tunnel is journaled or coalesced away")
			// A refused tunnel leaves nothing behind; a kept one costs a few goroutines.
			require.Less(t, g1-g0, 10*tc.want+100)
		})
	}
}
