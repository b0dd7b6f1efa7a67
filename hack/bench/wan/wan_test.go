package wanbench_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	ctlassets "github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/assetcache"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	wanbench "github.com/outpost-metal/outpost/hack/bench/wan"
	"github.com/outpost-metal/outpost/qemu/linklab"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// mb is the unit of every figure printed: 10^6 bytes.
const mb = 1_000_000

// benchConfig is what the environment asks of the benchmark.
type benchConfig struct {
	rtts      []time.Duration // WAN_RTTS, milliseconds (default 0,50,100,200)
	size      int64           // WAN_SIZE_MB, in 10^6 bytes (default 256)
	resumeRTT time.Duration   // WAN_RESUME_RTT_MS (default 100)
	repeat    int             // WAN_REPEAT: runs per figure, the median printed (default 3)
}

func loadConfig(t *testing.T) benchConfig {
	t.Helper()

	cfg := benchConfig{size: 256 * mb, resumeRTT: 100 * time.Millisecond, repeat: 3}

	rtts := cmpOr(os.Getenv("WAN_RTTS"), "0,50,100,200")
	for f := range strings.SplitSeq(rtts, ",") {
		ms, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "WAN_RTTS: milliseconds, comma separated")
		require.GreaterOrEqual(t, ms, 0, "WAN_RTTS")

		cfg.rtts = append(cfg.rtts, time.Duration(ms)*time.Millisecond)
	}

	if v := os.Getenv("WAN_SIZE_MB"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "WAN_SIZE_MB")
		require.Positive(t, n, "WAN_SIZE_MB")

		cfg.size = int64(n) * mb
	}

	if v := os.Getenv("WAN_RESUME_RTT_MS"); v != "" {
		ms, err := strconv.Atoi(v)
		require.NoError(t, err, "WAN_RESUME_RTT_MS")

		cfg.resumeRTT = time.Duration(ms) * time.Millisecond
	}

	if v := os.Getenv("WAN_REPEAT"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "WAN_REPEAT")
		require.Positive(t, n, "WAN_REPEAT")

		cfg.repeat = n
	}

	return cfg
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}

	return v
}

// writeAsset writes size random bytes to dir/<sha256>, as the controller's assets directory holds them, and
// returns the edge's reference to it.
func writeAsset(t *testing.T, dir string, size int64) assetcache.Ref {
	t.Helper()

	tmp := filepath.Join(dir, "tmp")
	f, err := os.Create(tmp)
	require.NoError(t, err)

	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, h), rand.Reader, size)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	digest := hex.EncodeToString(h.Sum(nil))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, digest)))

	return assetcache.Ref{Name: assetcache.AgentName(metal.AMD64, "initramfs.xz"), SHA256: digest, Size: size}
}

// fetchCalls records the relay's Fetch calls on the controller: the offset each asked for and when each returned.
type fetchCalls struct {
	mu       sync.Mutex
	started  int
	offsets  []int64
	returned chan struct{}
}

func (f *fetchCalls) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != assetsapi.AssetRelay_Fetch_FullMethodName {
		return handler(srv, ss)
	}

	f.mu.Lock()
	f.started++
	f.mu.Unlock()

	defer func() { f.returned <- struct{}{} }()

	return handler(srv, &offsetStream{ServerStream: ss, calls: f})
}

// wait waits for every Fetch call started so far to return and gives the offsets they asked for.
func (f *fetchCalls) wait(ctx context.Context) ([]int64, error) {
	f.mu.Lock()
	started := f.started
	f.mu.Unlock()

	for range started {
		select {
		case <-f.returned:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for relay calls: %w", ctx.Err())
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	return append([]int64(nil), f.offsets...), nil
}

type offsetStream struct {
	grpc.ServerStream

	calls *fetchCalls
}

func (s *offsetStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*assetsapi.FetchRequest); ok && err == nil {
		s.calls.mu.Lock()
		s.calls.offsets = append(s.calls.offsets, req.GetOffset())
		s.calls.mu.Unlock()
	}

	return err
}

// wanSite is a controller relaying from an assets directory and an edge filling its cache by relay, the edge's
// uplink going through a delay proxy.
type wanSite struct {
	catalog *ctlassets.Catalog
	calls   *fetchCalls
	proxy   *wanbench.Proxy
	fetcher *assetcache.Fetcher
}

// startSite starts the site; it returns once the edge's first session is up and its relay set.
func startSite(t *testing.T, assetDir string, rtt time.Duration) *wanSite {
	t.Helper()

	s := &wanSite{
		catalog: ctlassets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil),
		calls:   &fetchCalls{returned: make(chan struct{}, 1024)},
	}

	relay, err := ctlassets.NewRelay(ctlassets.DefaultRelay(), ctlassets.DirFiles{Dir: assetDir}, s.catalog, sites.SiteFromContext, zap.NewNop())
	require.NoError(t, err)

	ctl := linklab.StartController(t, linklab.ControllerOptions{
		Logger:        zap.NewNop(),
		Register:      []func(grpc.ServiceRegistrar){relay.Register},
		ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(s.calls.intercept)},
	})
	token := ctl.CreateSite(t, "wan", sites.TokenOptions{})

	var addr string

	s.proxy, addr = startProxy(t, ctl.Addr, rtt)

	cfg := assetcache.Default()
	cfg.Dir = t.TempDir()
	cfg.RetryBackoff = 20 * time.Millisecond

	store, err := assetcache.New(cfg, zap.NewNop(), nil)
	require.NoError(t, err)

	fcfg := assetcache.DefaultFetcher()
	fcfg.Policy = assetcache.PolicyOffline
	fcfg.ScrubInterval = 0

	s.fetcher, err = assetcache.NewFetcher(fcfg, store, nil, zap.NewNop())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)

	go func() { ran <- s.fetcher.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ran)
	})

	// Like Fetcher.OnSession without its reports, so that Changed is this benchmark's to watch.
	sessions := make(chan struct{}, 1)
	linklab.StartEdge(t, addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{
		Logger: zap.NewNop(),
		OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, conn grpc.ClientConnInterface) error {
			s.fetcher.SetRelay(assetcache.RelaySource{Client: assetsapi.NewAssetRelayClient(conn)})
			defer s.fetcher.SetRelay(nil)

			select {
			case sessions <- struct{}{}:
			default:
			}

			<-ctx.Done()

			return nil
		}},
	}})

	select {
	case <-sessions:
	case <-t.Context().Done():
	}

	return s
}

// fetch asks the edge to hold ref and returns how long it took to have it, verified, in its cache.
func (s *wanSite) fetch(t *testing.T, ref assetcache.Ref) time.Duration {
	t.Helper()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	start := time.Now()

	_, err := s.fetcher.Ensure(assetcache.PolicyOffline, []assetcache.Ref{ref})
	require.NoError(t, err)

	for {
		for _, st := range s.fetcher.Statuses() {
			if st.Ref.SHA256 != ref.SHA256 {
				continue
			}

			require.NotEqual(t, assetcache.StateFailed, st.State, "relay failed: %s", st.Err)

			if st.State == assetcache.StatePresent {
				return time.Since(start)
			}
		}

		select {
		case <-s.fetcher.Changed():
		case <-ctx.Done():
			t.Fatalf("asset not relayed: %v", ctx.Err())
		}
	}
}

// tcpThrough sends the file over one raw TCP connection through a delay proxy into io.Discard and returns how
// long it took from the dial to the last byte.
func tcpThrough(t *testing.T, path string, size int64, rtt time.Duration) time.Duration {
	t.Helper()

	target := serveOnce(t, func(c net.Conn) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close() //nolint:errcheck

		io.Copy(c, f) //nolint:errcheck // the receiver checks the length
	})
	_, addr := startProxy(t, target, rtt)

	start := time.Now()

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)

	defer c.Close() //nolint:errcheck

	n, err := io.Copy(io.Discard, c)
	elapsed := time.Since(start)

	require.NoError(t, err)
	require.Equal(t, size, n)

	return elapsed
}

func rate(size int64, d time.Duration) float64 { return float64(size) / mb / d.Seconds() }

// TestWANRelay prints, for each round-trip time, how fast one asset goes from the controller's relay into an
// edge's cache over the uplink through the delay proxy, beside raw TCP through the same proxy (each the median
// of WAN_REPEAT runs, the two kinds taking turns, so that other load on the machine weighs on both alike):
//
//	WANRELAY rtt_ms=<n> size_mb=<n> outpost_MBps=<x> tcp_MBps=<y>
func TestWANRelay(t *testing.T) {
	if os.Getenv("WAN_BENCH") != "1" {
		t.Skip("a throughput benchmark of a minute or two: run it with make bench-wan (WAN_BENCH=1)")
	}

	cfg := loadConfig(t)
	dir := t.TempDir()
	ref := writeAsset(t, dir, cfg.size)
	path := filepath.Join(dir, ref.SHA256)

	for _, rtt := range cfg.rtts {
		t.Run(fmt.Sprintf("rtt=%s", rtt), func(t *testing.T) {
			var outpost, tcp []time.Duration

			for i := range cfg.repeat {
				t.Run(fmt.Sprintf("outpost-%d", i), func(t *testing.T) {
					outpost = append(outpost, startSite(t, dir, rtt).fetch(t, ref))
				})
				t.Run(fmt.Sprintf("tcp-%d", i), func(t *testing.T) {
					tcp = append(tcp, tcpThrough(t, path, cfg.size, rtt))
				})
			}

			require.Len(t, outpost, cfg.repeat)
			require.Len(t, tcp, cfg.repeat)

			fmt.Printf("WANRELAY rtt_ms=%d size_mb=%d outpost_MBps=%.1f tcp_MBps=%.1f\n",
				rtt.Milliseconds(), cfg.size/mb, rate(cfg.size, median(outpost)), rate(cfg.size, median(tcp)))
		})
	}
}

// median returns the middle of the runs' durations.
func median(runs []time.Duration) time.Duration {
	slices.Sort(runs)

	return runs[len(runs)/2]
}

// TestWANRelayResumesAfterCut relays an asset through the delay proxy, cuts every connection once half of it
// has gone toward the edge, and checks that the edge resumes from what it held rather than from the start:
// the relay sends the asset once plus at most what was in flight at the cut. It prints
//
//	WANRESUME rtt_ms=<n> size_mb=<n> relayed_mb=<x> refetched_mb=<y> resumed_at_mb=<z>
func TestWANRelayResumesAfterCut(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the uplink through the delay proxy; skipped under -short")
	}

	cfg := loadConfig(t)
	dir := t.TempDir()
	ref := writeAsset(t, dir, cfg.size)

	site := startSite(t, dir, cfg.resumeRTT)
	site.proxy.CutAfter(cfg.size / 2)
	site.fetch(t, ref)

	require.Equal(t, 1, site.proxy.Cuts(), "the transfer was never cut")

	offsets, err := site.calls.wait(t.Context())
	require.NoError(t, err)

	require.GreaterOrEqual(t, len(offsets), 2, "no resumed stream")

	relayed := site.catalog.Site("wan").BytesRelayed
	refetched := relayed - cfg.size

	fmt.Printf("WANRESUME rtt_ms=%d size_mb=%d relayed_mb=%.1f refetched_mb=%.1f resumed_at_mb=%.1f\n",
		cfg.resumeRTT.Milliseconds(), cfg.size/mb, float64(relayed)/mb, float64(refetched)/mb,
		float64(offsets[len(offsets)-1])/mb)

	require.Zero(t, offsets[0])
	require.Positive(t, offsets[len(offsets)-1], "resumed from the start instead of the offset held")
	// What was in flight at the cut is sent again: at most a call's flow-control window, plus what gRPC queues
	// for writing and the chunk the edge was reading.
	require.LessOrEqual(t, refetched, int64(uplink.BulkCallWindow+1<<20), "refetched more than was in flight at the cut")
}
