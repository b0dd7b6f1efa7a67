package tftp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pintftp "github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/tftp"
)

// floodRate is the read requests per second the flood sends: about what the server decides per second on the
// loaded 2-core test machine (measured: 5,500/s while a 20,000/s flood took one core). Beyond the server's
// rate the flood is a bandwidth attack: the kernel drops datagrams from the socket buffer, the real client's
// request among them, before any program sees them, and only the client's own retries get it through.
const floodRate = 5_000

// flooder sends read requests for name to dst at floodRate until its context ends.
type flooder struct {
	sent   atomic.Int64
	forged bool
}

// forgedFlood sends each request from a random address in 127.16.0.0/12 and a random port, through a raw
// socket (needs root): every request is a new client to the server, as a forged flood on the site L2 is.
func (f *flooder) forgedFlood(ctx context.Context, dst netip.AddrPort, payloads [][]byte) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer syscall.Close(fd) //nolint:errcheck

	f.forged = true
	to := &syscall.SockaddrInet4{Addr: dst.Addr().As4()}
	rnd := make([]byte, 6)
	pkt := make([]byte, 0, 600)

	return pace(ctx, func(i int) {
		_, _ = rand.Read(rnd)
		src := [4]byte{127, 16 | rnd[0]&0x0f, rnd[1], rnd[2] | 1}
		payload := payloads[i%len(payloads)]

		pkt = pkt[:28]
		clear(pkt)
		pkt[0] = 0x45 // IPv4, 20-byte header; the kernel fills in the length, ID and checksum
		pkt[8] = 64
		pkt[9] = syscall.IPPROTO_UDP
		copy(pkt[12:16], src[:])
		copy(pkt[16:20], to.Addr[:])
		binary.BigEndian.PutUint16(pkt[20:], 1024+binary.BigEndian.Uint16(rnd[3:])%60000)
		binary.BigEndian.PutUint16(pkt[22:], dst.Port())
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload))) // small
		pkt = append(pkt, payload...)

		if syscall.Sendto(fd, pkt, 0, to) == nil {
			f.sent.Add(1)
		}
	})
}

// socketFlood sends from 1,024 sockets on 256 loopback addresses, each reopened (a new port) after each request.
func (f *flooder) socketFlood(ctx context.Context, dst netip.AddrPort, payloads [][]byte) error {
	conns := make([]*net.UDPConn, 1024)

	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()

	to := net.UDPAddrFromAddrPort(dst)

	return pace(ctx, func(i int) {
		k := i % len(conns)
		if conns[k] != nil {
			conns[k].Close()
		}

		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 17, byte(k/256), byte(k%256))})
		if err != nil {
			conns[k] = nil

			return
		}

		conns[k] = c

		if _, err := c.WriteToUDP(payloads[i%len(payloads)], to); err == nil {
			f.sent.Add(1)
		}
	})
}

// pace calls send floodRate times a second, in 1 ms batches, until ctx ends.
func pace(ctx context.Context, send func(i int)) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()

	begin, i := time.Now(), 0

	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			for due := int(now.Sub(begin).Seconds() * floodRate); i < due; i++ {
				send(i)
			}
		}
	}
}

// sampler records the peaks of the process's goroutines and open files.
type sampler struct {
	mu                sync.Mutex
	goroutines, files int
}

func (s *sampler) run(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()

	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			g, f := runtime.NumGoroutine(), openFiles()

			s.mu.Lock()
			s.goroutines, s.files = max(s.goroutines, g), max(s.files, f)
			s.mu.Unlock()
		}
	}
}

func (s *sampler) peaks() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.goroutines, s.files
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

func openFiles() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}

	return len(ents)
}

func legitimateFetch(t *testing.T, addr string, want []byte) time.Duration {
	t.Helper()

	c, err := pintftp.NewClient(addr)
	require.NoError(t, err)
	require.NoError(t, c.SetLocalAddr("127.0.0.2"))
	// What a ROM does: ask the size and a large block, wait a second per packet, give up after ten
	// timeouts in a row (iPXE's retry timer gives up after ten; it also backs off, which this client
	// does not, so this one gives up sooner than iPXE would).
	c.SetTimeout(time.Second)
	c.SetRetries(10)
	c.SetBlockSize(1468)
	c.RequestTSize(true)

	begin := time.Now()

	wt, err := c.Receive("ipxe.efi", "octet")
	require.NoError(t, err, "the legitimate request was not answered")

	var buf bytes.Buffer

	_, err = wt.WriteTo(&buf)
	require.NoError(t, err, "the legitimate transfer did not complete")
	require.Equal(t, want, buf.Bytes())

	return time.Since(begin)
}

// TestFloodLegitimateTransferCompletes is the TFTP attack: a flood of read requests for the iPXE binary that
// never acknowledge anything (forged sources when root, else many loopback addresses and ports), while a
// ROM-like client fetches the 1 MiB binary. The flood displaces only its own kind; the server holds at most
// MaxTransfers transfers (each one goroutine of pin/tftp's, and no socket: the library runs in single-port
// mode) and the real client completes.
func TestFloodLegitimateTransferCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("attack test: skipped under -short")
	}

	data := make([]byte, 1<<20)
	_, err := rand.Read(data)
	require.NoError(t, err)

	cfg := tftp.Default()
	// The client fetches back to back, 10-20 times a second from one address: more than a ROM asks.
	cfg.RequestRatePerSource = 1000
	srv := start(t, cfg, bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": data}))
	dst := netip.MustParseAddrPort(srv.addr)

	g0, f0, rss0 := runtime.NumGoroutine(), openFiles(), rssMiB()
	// Without the flood: the median of five fetches.
	var quietRuns []time.Duration
	for range 5 {
		quietRuns = append(quietRuns, legitimateFetch(t, srv.addr, data))
	}

	slices.Sort(quietRuns)
	quiet := quietRuns[len(quietRuns)/2]

	ctx, cancel := context.WithCancel(context.Background())

	var (
		fl  flooder
		smp sampler
		wg  sync.WaitGroup
	)

	payloads := [][]byte{rrq("ipxe.efi", "octet"), rrq("ipxe.efi", "octet", "blksize", "1468", "tsize", "0")}

	wg.Go(func() { smp.run(ctx) })
	wg.Go(func() {
		if os.Geteuid() == 0 {
			if err := fl.forgedFlood(ctx, dst, payloads); err == nil {
				return
			}
		}

		t.Log("not root (or no raw socket): flooding from real sockets on 127.17.0.0/22 instead of forged sources")
		_ = fl.socketFlood(ctx, dst, payloads)
	})

	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})

	// The flood fills the bound first.
	require.Eventually(t, func() bool { return srv.Stats().Held >= cfg.MaxTransfers }, 30*time.Second, time.Millisecond,
		"the flood never filled the transfer bound")

	// Fetch again and again for 5 s of flood: longer than a forged transfer lives (1+FirstRetries timeouts).
	var underFlood []time.Duration
	for until := time.Now().Add(5 * time.Second); time.Now().Before(until); {
		underFlood = append(underFlood, legitimateFetch(t, srv.addr, data))
	}

	slices.Sort(underFlood)

	st := srv.Stats()
	gPeak, fPeak := smp.peaks()
	rss1 := rssMiB()
	sent := fl.sent.Load()

	cancel()
	wg.Wait()

	t.Logf("flood: %d requests at %d/s (forged sources: %t); server: %d served, %d duplicate, %d evicted (total bound), %d evicted (per source), %d refused, %d shed (overloaded), %d rate-limited",
		sent, floodRate, fl.forged, srv.RequestCount("served"), srv.RequestCount("duplicate"),
		st.Evicted["total"], st.Evicted["per_source"], srv.RequestCount("refused_total")+srv.RequestCount("refused_per_source"),
		srv.RequestCount("overloaded"), srv.RequestCount("rate_limited"))
	t.Logf("transfers held: peak %d (bound %d); process (server, flood, client): goroutines %d before, peak %d under flood; open files %d before, peak %d; RSS %.0f MiB before, %.0f MiB at the end of the flood",
		st.Peak, cfg.MaxTransfers, g0, gPeak, f0, fPeak, rss0, rss1)
	t.Logf("legitimate 1 MiB fetch: median %s without the flood; under it %d fetches, median %s, slowest %s",
		quiet.Round(time.Millisecond), len(underFlood), underFlood[len(underFlood)/2].Round(time.Millisecond),
		underFlood[len(underFlood)-1].Round(time.Millisecond))

	require.LessOrEqual(t, st.Peak, cfg.MaxTransfers)
	require.Positive(t, st.Evicted["total"]+st.Evicted["per_source"])
	// One goroutine per transfer and no socket, plus the test's own (the socket flood's 1,024 sockets). An
	// evicted transfer's goroutine exits when the library reads the error it is handed, and the server takes
	// no new transfer while 1.5 × MaxTransfers are still running.
	require.Less(t, gPeak, g0+cfg.MaxTransfers*3/2+50)
	require.Less(t, fPeak, f0+1024+50)
}
