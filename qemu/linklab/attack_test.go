package linklab_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// Attack sizes: what was seen to lock every edge out, and more.
const (
	attackIdle       = 500  // idle TCP connections, re-opened as the controller closes them
	attackIdleFrom   = 10   // from this many addresses
	attackEnroll     = 1500 // enrolment sessions tried and, when given, held
	attackEnrollBad  = 500  // of which with wrong tokens for sites that do not exist, the rest with a leaked reusable token
	attackEnrollFrom = 30   // from this many addresses
	phase            = 10 * time.Second
	enrolAt          = 2 * time.Second // into each phase, a new edge enrols
)

// phaseFigures are what one phase (with or without the attack) measured.
type phaseFigures struct {
	enrol          time.Duration // a new edge's enrolment, to its first session
	rssStart       int64         // controller RSS in bytes at the phase's start, its peak and at its end
	rssPeak        int64
	rssEnd         int64
	logBytes       int     // controller log written during the phase
	steadyDown     int     // samples (every 50 ms) in which the already connected edge was not connected
	steadySessions int64   // sessions the already connected edge opened during the phase
	handshakesPeak float64 // outpost_uplink_handshakes_in_progress, peak
	enrollPeak     float64 // outpost_uplink_enroll_sessions, peak
	cpu            float64 // controller CPU seconds used during the phase
	testCPU        float64 // this process's (edges' and attackers') CPU seconds during the phase
	rejected       map[string]float64
}

// attackCounts are what the attacker saw.
type attackCounts struct {
	idleDials, idleClosedAtOnce, idleClosedAtTimeout     atomic.Int64
	enrollDials, enrollClosedBeforeTLS, enrollHeld, held atomic.Int64
	heldPeak                                             atomic.Int64
	codes                                                sync.Map // reply code -> *atomic.Int64
}

func (a *attackCounts) code(c uplinkpb.HelloReply_Code) {
	v, _ := a.codes.LoadOrStore(c.String(), new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// TestAttackFloodLocksNoEdgeOut runs the real controller binary and, from other loopback addresses than the
// edges', holds 500 idle TCP connections and tries 1,500 enrolment sessions on its uplink port (a third with
// wrong tokens, the rest with a leaked reusable token of a site of their own), re-opening whatever the
// controller closes. Meanwhile (a) a new edge enrols within 5 s and (b) an already connected edge stays
// connected; the controller's memory and log stay bounded. Every figure is printed beside the same figure
// from the same run without the attack.
func TestAttackFloodLocksNoEdgeOut(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the controller binary under a flood; skipped with -short")
	}

	bin := buildBinaries(t)
	controllerBin := filepath.Join(bin, "controller")
	stateDir := t.TempDir()
	httpAddr := freeLoopbackPort(t)

	ctl := startProcess(t, nil, controllerBin, "--state-dir", stateDir, "--uplink-listen", "127.0.0.1:0", "--http-listen", httpAddr)
	uplinkAddr := ctl.logField(t, "controller built", "uplink")
	pid := ctl.cmd.Process.Pid

	createSite := func(site string, args ...string) string {
		out, err := exec.Command(controllerBin, append([]string{"--state-dir", stateDir, "site", "create", site}, args...)...).Output()
		require.NoError(t, err)

		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}

	leaked := createSite("leaked", "--reusable")

	leakedTok, err := uplink.ParseJoinToken(leaked)
	require.NoError(t, err)

	fp := leakedTok.CAFingerprint

	// The already connected edge: its sessions are counted from here on.
	var steadySessions atomic.Int64

	steady := linklab.StartEdge(t, uplinkAddr, createSite("steady"), linklab.EdgeOptions{Options: edgeuplink.Options{
		Logger: zap.NewNop(),
		OnSession: []edgeuplink.SessionFunc{func(context.Context, grpc.ClientConnInterface) error {
			steadySessions.Add(1)

			return nil
		}},
	}})
	require.Eventually(t, steady.Client.Connected, 10*time.Second, 10*time.Millisecond)

	runPhase := func(name string) phaseFigures {
		fig := phaseFigures{rssStart: rss(t, pid)}
		fig.rssPeak = fig.rssStart
		cpuStart, testCPUStart := value(scrape(t, httpAddr), "process_cpu_seconds_total"), selfCPU(t)
		logStart := len(ctl.log.String())
		sessionsStart := steadySessions.Load()
		fresh := createSite("fresh-" + name)

		start := time.Now()
		sample := time.NewTicker(50 * time.Millisecond)

		defer sample.Stop()

		var (
			enrolled = make(chan time.Duration, 1)
			edge     *linklab.Edge
		)

		// A measurement window, not a wait for state: both phases last as long, so their figures compare.
		for elapsed := time.Duration(0); elapsed < phase; elapsed = time.Since(start) {
			<-sample.C

			if edge == nil && time.Since(start) >= enrolAt {
				began := time.Now()
				edge = linklab.StartEdge(t, uplinkAddr, fresh, linklab.EdgeOptions{Options: edgeuplink.Options{
					Logger: zap.NewNop(),
					OnSession: []edgeuplink.SessionFunc{func(context.Context, grpc.ClientConnInterface) error {
						select {
						case enrolled <- time.Since(began):
						default:
						}

						return nil
					}},
				}})
			}

			if !steady.Client.Connected() {
				fig.steadyDown++
			}

			fig.rssPeak = max(fig.rssPeak, rss(t, pid))
			m := scrape(t, httpAddr)
			fig.handshakesPeak = max(fig.handshakesPeak, value(m, "outpost_uplink_handshakes_in_progress"))
			fig.enrollPeak = max(fig.enrollPeak, value(m, "outpost_uplink_enroll_sessions"))
		}

		select {
		case fig.enrol = <-enrolled:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the new edge did not enrol within 30 s", name)
		}

		fig.rssEnd = rss(t, pid)
		fig.logBytes = len(ctl.log.String()) - logStart
		fig.steadySessions = steadySessions.Load() - sessionsStart
		m := scrape(t, httpAddr)
		fig.rejected = rejectedByReason(m)
		fig.cpu = value(m, "process_cpu_seconds_total") - cpuStart
		fig.testCPU = selfCPU(t) - testCPUStart

		return fig
	}

	quiet := runPhase("quiet")

	// The attack.
	before := rejectedByReason(scrape(t, httpAddr))
	actx, stopAttack := context.WithCancel(t.Context())

	var (
		attackers sync.WaitGroup
		counts    attackCounts
	)

	for i := range attackIdle {
		ip := fmt.Sprintf("127.0.40.%d", 1+i%attackIdleFrom)

		attackers.Go(func() { idleAttacker(actx, uplinkAddr, ip, &counts) })
	}

	for i := range attackEnroll {
		ip := fmt.Sprintf("127.0.41.%d", 1+i%attackEnrollFrom)
		token, site := leaked, "leaked"

		if i < attackEnrollBad {
			site = fmt.Sprintf("guess-%d", i)
			token = uplink.JoinToken{SiteID: site, Secret: randomSecret(), CAFingerprint: fp}.String()
		}

		attackers.Go(func() { enrollAttacker(actx, uplinkAddr, ip, site, token, &counts) })
	}

	attacked := runPhase("attacked")

	stopAttack()
	attackers.Wait()

	for reason, v := range before {
		attacked.rejected[reason] -= v
	}

	require.Eventually(t, func() bool {
		m := scrape(t, httpAddr)

		return value(m, "outpost_uplink_handshakes_in_progress") == 0 && value(m, "outpost_uplink_enroll_sessions") == 0
	}, 30*time.Second, 100*time.Millisecond, "the controller still holds attack connections after the attack")

	after := rss(t, pid)

	mb := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }
	codes := map[string]int64{}

	counts.codes.Range(func(k, v any) bool {
		codes[k.(string)] = v.(*atomic.Int64).Load()

		return true
	})

	t.Logf("attack: %d idle TCP connections from %d addresses, %d enrolment sessions tried from %d addresses (%d with wrong tokens), each re-opened when closed; phases of %s",
		attackIdle, attackIdleFrom, attackEnroll, attackEnrollFrom, attackEnrollBad, phase)
	t.Logf("%-46s %-22s %s", "", "no attack", "under attack")
	t.Logf("%-46s %-22s %s", "(a) new edge: enrolment to first session", quiet.enrol.Round(time.Millisecond), attacked.enrol.Round(time.Millisecond))
	t.Logf("%-46s %-22s %s", "(b) connected edge: samples not connected", strconv.Itoa(quiet.steadyDown), strconv.Itoa(attacked.steadyDown))
	t.Logf("%-46s %-22s %s", "(b) connected edge: new sessions (reconnects)", strconv.FormatInt(quiet.steadySessions, 10), strconv.FormatInt(attacked.steadySessions, 10))
	t.Logf("%-46s %-22s %s", "controller RSS at start / peak / end", mb(quiet.rssStart)+" / "+mb(quiet.rssPeak)+" / "+mb(quiet.rssEnd),
		mb(attacked.rssStart)+" / "+mb(attacked.rssPeak)+" / "+mb(attacked.rssEnd))
	t.Logf("%-46s %-22s %s", "controller log written", fmt.Sprintf("%d bytes", quiet.logBytes), fmt.Sprintf("%d bytes", attacked.logBytes))
	t.Logf("%-46s %-22s %s", "handshakes in progress, peak", strconv.FormatFloat(quiet.handshakesPeak, 'f', 0, 64), strconv.FormatFloat(attacked.handshakesPeak, 'f', 0, 64))
	t.Logf("%-46s %-22s %s", "enrolment sessions open, peak", strconv.FormatFloat(quiet.enrollPeak, 'f', 0, 64), strconv.FormatFloat(attacked.enrollPeak, 'f', 0, 64))
	t.Logf("%-46s %-22s %s", "controller CPU used", fmt.Sprintf("%.2f s", quiet.cpu), fmt.Sprintf("%.2f s", attacked.cpu))
	t.Logf("%-46s %-22s %s", "test process (edges, attackers) CPU used", fmt.Sprintf("%.2f s", quiet.testCPU), fmt.Sprintf("%.2f s", attacked.testCPU))
	t.Logf("%-46s %-22v %v", "refused by the controller, by reason", nonZero(quiet.rejected), nonZero(attacked.rejected))
	t.Logf("attacker saw: idle dials %d (closed at once %d, at the TLS timeout %d); enrolment dials %d (closed before TLS %d, sessions given %d, held at once at most %d); hello replies %v",
		counts.idleDials.Load(), counts.idleClosedAtOnce.Load(), counts.idleClosedAtTimeout.Load(),
		counts.enrollDials.Load(), counts.enrollClosedBeforeTLS.Load(), counts.enrollHeld.Load(), counts.heldPeak.Load(), codes)
	t.Logf("controller RSS after the attack: %s", mb(after))

	require.Less(t, attacked.enrol, 5*time.Second, "(a) a real edge must enrol within 5 s under the attack")
	require.Zero(t, attacked.steadyDown, "(b) the connected edge lost its session")
	require.Zero(t, attacked.steadySessions, "(b) the connected edge reconnected")
	require.Less(t, attacked.rssPeak-quiet.rssEnd, int64(64<<20), "controller memory grew by more than 64 MB under the attack")
	require.Less(t, attacked.logBytes, 64<<10, "controller log grew by more than 64 KiB in %s under the attack", phase)
	require.LessOrEqual(t, attacked.enrollPeak, 5.0, "the leaked token's site holds at most 4 enrolment sessions (and the new edge one)")
	require.LessOrEqual(t, attacked.handshakesPeak, float64(attackIdleFrom*16+attackEnrollFrom*16))
	require.Positive(t, attacked.rejected["source_handshakes"]+attacked.rejected["source_rate"])
	require.Positive(t, attacked.rejected["tls_timeout"])
	require.LessOrEqual(t, counts.heldPeak.Load(), int64(4), "attackers held more enrolment sessions than the site's 4")
}

// idleAttacker opens a TCP connection from ip, sends nothing until the controller closes it, and does it again.
func idleAttacker(ctx context.Context, addr, ip string, counts *attackCounts) {
	dial := linklab.DialFrom(ip)

	for ctx.Err() == nil {
		conn, err := dial(ctx, addr)
		if err == nil {
			counts.idleDials.Add(1)
			stop := context.AfterFunc(ctx, func() { conn.Close() }) //nolint:errcheck

			switch d := waitClosed(conn, time.Minute); {
			case d < time.Second:
				counts.idleClosedAtOnce.Add(1)
			default:
				counts.idleClosedAtTimeout.Add(1)
			}

			stop()
			conn.Close() //nolint:errcheck
		}

		pause(ctx, 500*time.Millisecond)
	}
}

// attackerTLS is what an attacker would use: no verification of the controller and the cheapest key exchange,
// so that the attack costs this process (and the machine the test shares) as little as it can.
var attackerTLS = &tls.Config{
	MinVersion:         tls.VersionTLS13,
	InsecureSkipVerify: true, // the attacker trusts anything
	CurvePreferences:   []tls.CurveID{tls.X25519},
}

// enrollAttacker sends an enrolment hello from ip and holds the session when given one, and does it again.
func enrollAttacker(ctx context.Context, addr, ip, site, token string, counts *attackCounts) {
	for ctx.Err() == nil {
		counts.enrollDials.Add(1)

		conn, reply, err := enrollHello(ctx, addr, ip, attackerTLS, site, token)

		switch {
		case err != nil:
			counts.enrollClosedBeforeTLS.Add(1)
		case reply.GetCode() == uplinkpb.HelloReply_CODE_ACCEPTED:
			counts.enrollHeld.Add(1)

			storeMax(&counts.heldPeak, counts.held.Add(1))

			stop := context.AfterFunc(ctx, func() { conn.Close() }) //nolint:errcheck
			waitClosed(conn, time.Minute)
			stop()
			counts.held.Add(-1)
		default:
			counts.code(reply.GetCode())
		}

		if conn != nil {
			conn.Close() //nolint:errcheck
		}

		pause(ctx, time.Second)
	}
}

func storeMax(peak *atomic.Int64, v int64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d/2 + rand.N(d)): // pacing
	}
}

func randomSecret() []byte {
	b := make([]byte, uplink.SecretLen)
	for i := range b {
		b[i] = byte(rand.N(256)) // a wrong guess
	}

	return b
}

// selfCPU returns the CPU seconds this process has used.
func selfCPU(t *testing.T) float64 {
	t.Helper()

	var ru syscall.Rusage

	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))

	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// rss returns the resident set of process pid in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()

	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)

	defer f.Close() //nolint:errcheck

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)

			return kb << 10
		}
	}

	t.Fatalf("no VmRSS in /proc/%d/status", pid)

	return 0
}

// scrape returns the controller's metrics, one sample a series (histograms and summaries give their _bucket, _sum
// and _count series).
func scrape(t *testing.T, addr string) model.Vector {
	t.Helper()

	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)

	samples, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, slices.Collect(maps.Values(families))...)
	require.NoError(t, err)

	return samples
}

// value is the value of the unlabelled series name in samples (0 when it is not served).
func value(samples model.Vector, name string) float64 {
	for _, s := range samples {
		if s.Metric[model.MetricNameLabel] == model.LabelValue(name) && len(s.Metric) == 1 {
			return float64(s.Value)
		}
	}

	return 0
}

// rejectedByReason is the controller's count of refused uplink connections by reason.
func rejectedByReason(samples model.Vector) map[string]float64 {
	out := map[string]float64{}

	for _, s := range samples {
		if s.Metric[model.MetricNameLabel] == "outpost_uplink_rejected_total" {
			out[string(s.Metric["reason"])] = float64(s.Value)
		}
	}

	return out
}

func nonZero(m map[string]float64) string {
	var parts []string

	for k, v := range m {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s:%.0f", k, v))
		}
	}

	sort.Strings(parts)

	if len(parts) == 0 {
		return "none"
	}

	return strings.Join(parts, " ")
}

// freeLoopbackPort returns a loopback address no one listens on (for a binary's listener whose address it does not log).
func freeLoopbackPort(t *testing.T) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	return addr
}
