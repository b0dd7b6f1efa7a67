package httpd_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/httpd"
)

// slowloris holds connections open with headers that never end, one line every period, from many loopback
// addresses; a connection the server closes is dialled again at the next round. It runs on a few goroutines.
type slowloris struct {
	target string
	period time.Duration

	open, dials, failed atomic.Int64
}

func (s *slowloris) run(ctx context.Context, clients, shards int, addr func(i int) net.IP) {
	var wg sync.WaitGroup

	for shard := range shards {
		wg.Go(func() {
			var conns []net.Conn

			var locals []net.IP

			for i := shard; i < clients; i += shards {
				locals = append(locals, addr(i))
			}

			conns = make([]net.Conn, len(locals))

			defer func() {
				for _, c := range conns {
					if c != nil {
						c.Close()
					}
				}
			}()

			tick := time.NewTicker(s.period)
			defer tick.Stop()

			for {
				for i, c := range conns {
					if ctx.Err() != nil {
						return
					}

					if c != nil {
						if _, err := io.WriteString(c, "X-Slow: 1\r\n"); err == nil {
							continue
						}

						c.Close()
						conns[i] = nil
						s.open.Add(-1)
					}

					conns[i] = s.dial(locals[i])
				}

				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}

	wg.Wait()
}

func (s *slowloris) dial(local net.IP) net.Conn {
	s.dials.Add(1)

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local}, Timeout: 2 * time.Second}

	c, err := d.Dial("tcp", s.target)
	if err != nil {
		s.failed.Add(1)

		return nil
	}

	if _, err := io.WriteString(c, "GET /ipxe/boot.ipxe HTTP/1.1\r\nHost: edge\r\n"); err != nil {
		c.Close()
		s.failed.Add(1)

		return nil
	}

	s.open.Add(1)

	return c
}

var kernelRE = regexp.MustCompile(`(?m)^kernel (\S+)`)

// bootOverHTTP is what a booting machine's iPXE does over HTTP, on a new connection: boot.ipxe, then the kernel.
func bootOverHTTP(t *testing.T, base string, kernelSize int) (time.Duration, error) {
	t.Helper()

	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	defer tr.CloseIdleConnections()

	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	begin := time.Now()

	resp, err := client.Get(base + "/ipxe/boot.ipxe?uuid=" + uuidUnknown + "&mac=52-54-00-12-34-56&arch=x86_64")
	if err != nil {
		return 0, fmt.Errorf("boot.ipxe: %w", err)
	}

	script, err := io.ReadAll(resp.Body)
	resp.Body.Close()

	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("boot.ipxe: %s, %w", resp.Status, err)
	}

	m := kernelRE.FindSubmatch(script)
	if m == nil {
		return 0, fmt.Errorf("no kernel line in %q", script)
	}

	resp, err = client.Get(string(m[1]))
	if err != nil {
		return 0, fmt.Errorf("kernel: %w", err)
	}

	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	if err != nil || n != int64(kernelSize) {
		return 0, fmt.Errorf("kernel: %d of %d bytes: %w", n, kernelSize, err)
	}

	return time.Since(begin), nil
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

// slowlorisEnv names the variable that turns a run of this test binary into a slow-client process.
const slowlorisEnv = "OUTPOST_TEST_SLOWLORIS"

// TestSlowlorisProcess is not a test: started by TestSlowClientsCannotStopBooting with slowlorisEnv set to
// "<target> <clients> <first address>", it holds that many slow clients from 127.3.<n>.<m> until its standard
// input closes, printing "open=<n> dials=<n> failed=<n>" twice a second. Each process has its own open-files
// limit (20,000 here, and this test cannot raise it: no CAP_SYS_RESOURCE), so 20,000 clients take two.
func TestSlowlorisProcess(t *testing.T) {
	spec := os.Getenv(slowlorisEnv)
	if spec == "" {
		t.Skip("helper process for TestSlowClientsCannotStopBooting")
	}

	var (
		target        string
		clients, from int
	)

	_, err := fmt.Sscan(spec, &target, &clients, &from)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())

	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	sl := &slowloris{target: target, period: time.Second}

	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()

		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				fmt.Printf("open=%d dials=%d failed=%d\n", sl.open.Load(), sl.dials.Load(), sl.failed.Load())
			}
		}
	}()

	// 250 addresses per 10,000 clients: 40 each, above the per-source bound, so both bounds are at work.
	sl.run(ctx, clients, 8, func(i int) net.IP {
		k := from + i%250

		return net.IPv4(127, 3, byte(k/250), byte(1+k%250))
	})
}

// attackers are slow-client processes and what they last reported.
type attackers struct {
	mu    sync.Mutex
	state map[int][3]int64 // process -> open, dials, failed
	wg    sync.WaitGroup
	stdin []io.Closer
}

func (a *attackers) start(t *testing.T, target string, clients, from int) {
	t.Helper()

	cmd := exec.Command(os.Args[0], "-test.run=^TestSlowlorisProcess$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", slowlorisEnv, target, clients, from))
	cmd.Stderr = os.Stderr

	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)

	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	a.mu.Lock()
	id := len(a.stdin)
	a.stdin = append(a.stdin, stdin)
	a.mu.Unlock()

	a.wg.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var open, dials, failed int64
			if _, err := fmt.Sscanf(sc.Text(), "open=%d dials=%d failed=%d", &open, &dials, &failed); err == nil {
				a.mu.Lock()
				a.state[id] = [3]int64{open, dials, failed}
				a.mu.Unlock()
			}
		}

		_ = cmd.Wait()
	})
}

// totals returns the open connections, dials and failed dials of all processes.
func (a *attackers) totals() (open, dials, failed int64) {
	a.mu.Lock()
	defer a.mu.Unlock()

	for _, s := range a.state {
		open, dials, failed = open+s[0], dials+s[1], failed+s[2]
	}

	return open, dials, failed
}

func (a *attackers) stop() {
	a.mu.Lock()
	for _, c := range a.stdin {
		c.Close()
	}
	a.stdin = nil
	a.mu.Unlock()

	a.wg.Wait()
}

// TestSlowClientsCannotStopBooting is the HTTP attack: 20,000 slow clients, in two processes of 10,000 (this
// process could not hold them and the server within its 20,000 open files), from 500 loopback addresses, hold
// connections with headers that never end, while a machine boots: boot.ipxe and an 8 MiB kernel on a new
// connection each time. The server holds at most MaxConns of them (the oldest never-answered ones make room),
// each ends after ReadHeaderTimeout at most, and the boots go through.
func TestSlowClientsCannotStopBooting(t *testing.T) {
	if testing.Short() {
		t.Skip("attack test: skipped under -short")
	}

	cfg := httpd.Default()
	cfg.ReadHeaderTimeout = 3 * time.Second // the default 10 s, shortened to see slow clients time out within the test

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))

	tbl, err := boot.Open(boot.Config{StateDir: t.TempDir()}, log)
	require.NoError(t, err)

	files := t.TempDir()
	kernel := make([]byte, 8<<20)
	_, err = rand.Read(kernel)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(files, "agent/x86_64"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(files, "agent/x86_64/vmlinuz"), kernel, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(files, "agent/x86_64/initramfs.xz"), []byte("initrd"), 0o644))

	srv, err := httpd.New(cfg, log, httpd.Deps{
		Table: tbl, Catalog: bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": []byte("x")}), Assets: newAssets(t, files),
	})
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)

	go func() { served <- srv.Serve(ctx, ln, srv.Handler()) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
		require.NoError(t, srv.Close())
	})

	base := "http://" + ln.Addr().String()

	g0, rss0, files0 := runtime.NumGoroutine(), rssMiB(), openFiles()
	// Without the attack: the median of five boots (the first one also warms the page cache).
	var quietRuns []time.Duration

	for range 5 {
		d, err := bootOverHTTP(t, base, len(kernel))
		require.NoError(t, err)

		quietRuns = append(quietRuns, d)
	}

	slices.Sort(quietRuns)
	quiet := quietRuns[len(quietRuns)/2]

	const clients = 20_000

	att := &attackers{state: map[int][3]int64{}}
	t.Cleanup(att.stop)

	for p := range clients / 10_000 {
		att.start(t, ln.Addr().String(), 10_000, p*250)
	}

	// The attack holds the bound and all its clients are connected (or being dialled again) first.
	require.Eventually(t, func() bool {
		_, dials, _ := att.totals()

		return srv.ConnStats().Held >= cfg.MaxConns && dials >= clients
	}, 2*time.Minute, 10*time.Millisecond, "the slow clients never filled the connection bound")

	// Boot again and again for twice the read-header timeout, watching the process.
	var (
		underAttack     []time.Duration
		gPeak, filePeak int
		rssPeak         float64
		failures        []error
	)

	openAtStart, _, _ := att.totals()

	for until := time.Now().Add(2 * cfg.ReadHeaderTimeout); time.Now().Before(until); {
		d, err := bootOverHTTP(t, base, len(kernel))
		if err != nil {
			failures = append(failures, err)
		} else {
			underAttack = append(underAttack, d)
		}

		gPeak, rssPeak, filePeak = max(gPeak, runtime.NumGoroutine()), max(rssPeak, rssMiB()), max(filePeak, openFiles())
	}

	st := srv.ConnStats()
	open, dials, failed := att.totals()

	att.stop()

	slices.Sort(underAttack)
	require.NotEmpty(t, underAttack, "no boot got through: %v", failures)

	t.Logf("slow clients: %d in 2 processes; %d dials (%d failed); %d connected (as the clients see it) when the boots began, %d at the end", clients, dials, failed, openAtStart, open)
	t.Logf("server: connections held peak %d (bound %d, per source %d); %d reset at once; %d closed to make room (per source %d, total %d)",
		st.Peak, cfg.MaxConns, cfg.MaxConnsPerSource, st.Refused["per_source"]+st.Refused["total"],
		st.Evicted["per_source"]+st.Evicted["total"], st.Evicted["per_source"], st.Evicted["total"])
	t.Logf("server process: goroutines %d before, peak %d; open files %d before, peak %d; RSS %.0f MiB before, peak %.0f MiB",
		g0, gPeak, files0, filePeak, rss0, rssPeak)
	t.Logf("boot (boot.ipxe + 8 MiB kernel, new connection): median %s without the attack; under it %d boots, median %s, slowest %s, %d failed",
		quiet.Round(time.Millisecond), len(underAttack), underAttack[len(underAttack)/2].Round(time.Millisecond),
		underAttack[len(underAttack)-1].Round(time.Millisecond), len(failures))

	require.Empty(t, failures, "a boot failed under the attack")
	require.LessOrEqual(t, st.Peak, cfg.MaxConns)
	require.Less(t, filePeak, files0+cfg.MaxConns+100, "open files beyond the connection bound")
	// A goroutine per server connection and the test's own.
	require.Less(t, gPeak, g0+cfg.MaxConns+100)
}

func openFiles() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}

	return len(ents)
}
