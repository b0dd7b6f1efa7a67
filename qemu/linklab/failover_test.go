package linklab_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/linklab"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/qemu/testagent"
	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// hasLine reports whether the process logged msg with field equal to value (any value when value is "").
func (p *process) hasLine(msg, field, value string) bool {
	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != msg {
			continue
		}

		if v, _ := line[field].(string); field == "" || value == "" || v == value {
			return true
		}
	}

	return false
}

// TestBinariesStandbyTakesOverMidWipe runs two controller binaries of one provider against the Omni stand-in
// (each with a state directory of its own), an edge given both addresses, and a machine (test agent, virtual IPMI
// BMC). The first controller acts; it is killed while the accepted machine's wipe is in progress (the agent holds
// it). The standby acts after the lease runs out and the edge reconnects to it; the wipe the killed controller
// started goes on at the edge (it is not the caller's to cancel), the standby settles its intent (joins it or
// finds it done) rather than wiping again: the agent gets one wipe call, the machine is ready, and its BMC saw
// no power action.
func TestBinariesStandbyTakesOverMidWipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped with -short")
	}

	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	bin := buildBinaries(t)

	stand, omniLn := serveStandIn(t)

	const lease = 3 * time.Second

	pair := startStandbyPair(t, bin, stand, omniLn.Addr().String(), omniLn.Addr().String(), lease)
	a, b, addrB, edge := pair.a, pair.b, pair.addrB, pair.edge
	httpAddr := edge.logField(t, "edge starting", "http")
	apiAddr := edge.logField(t, "edge starting", "agent_api")

	const machineID = "5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c12"

	// The machine boots through the edge (its join config fetched from this address): the boot evidence its
	// agent's tunnel is bound to.
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/config?u=" + machineID)
		if err != nil {
			return false
		}

		resp.Body.Close() //nolint:errcheck

		return resp.StatusCode == http.StatusOK
	}, time.Minute, 100*time.Millisecond, "the edge never served the join config")

	// The agent holds the first wipe until the standby has taken over; every later one goes ahead.
	var (
		wipeCalls, wipesDone atomic.Int32
		firstHeld            = make(chan struct{})
		releaseFirst         = make(chan struct{})
	)

	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xa5}, 1<<20), 0o600))

	machine := &fakeMachine{t: t, http: httpAddr, cfg: testagent.Config{
		Endpoint: apiAddr, MachineID: machineID, Disks: []string{disk},
		RetryInterval: 100 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		BeforeWipe: func(ctx context.Context) error {
			if wipeCalls.Add(1) == 1 {
				close(firstHeld)

				select {
				case <-releaseFirst:
				case <-ctx.Done():
					return ctx.Err()
				}
			}

			wipesDone.Add(1)

			return nil
		},
	}}
	t.Cleanup(machine.stop)

	var (
		powerMu sync.Mutex
		power   []vbmc.Action
	)

	chassis := vbmc.NewChassis(vbmc.WithHook(func(ctx context.Context, action vbmc.Action, o vbmc.Override) error {
		powerMu.Lock()
		power = append(power, action)
		powerMu.Unlock()

		return machine.hook(ctx, action, o)
	}))
	require.NoError(t, chassis.SetPower(ctx, true))

	powerMu.Lock()
	power = nil // the test's own power-on
	powerMu.Unlock()

	bmcConn := serveIPMI(t, chassis, "admin", "lab-password")

	joinToken, err := omni.NewAdmin(stand.State()).JoinToken(ctx, "bare-metal")
	require.NoError(t, err)
	provision(ctx, t, omniLn.Addr().String(), joinToken, machineID)

	admin := omni.NewAdmin(stand.State())
	require.NoError(t, admin.SetBMCConfig(ctx, machineID, &specs.InfraMachineBMCConfigSpec_IPMI{
		Address: "127.0.0.1", Port: uint32(bmcConn.LocalAddr().(*net.UDPAddr).Port), Username: "admin", Password: "lab-password",
	}))
	require.NoError(t, admin.Accept(ctx, machineID))

	select {
	case <-firstHeld:
	case <-ctx.Done():
		t.Fatal("the first controller never asked for the wipe")
	}

	// The active controller dies in the middle of the wipe.
	killed := time.Now()

	require.NoError(t, a.cmd.Process.Kill())
	a.cmd.Wait() //nolint:errcheck

	require.Eventually(t, actingCheck(b), 30*time.Second, 50*time.Millisecond, "the standby did not act within 30 s")
	tookOver := time.Since(killed)

	require.Eventually(t, func() bool { return edge.hasLine("uplink connected", "controller", addrB) }, time.Minute, 50*time.Millisecond,
		"the edge did not reconnect to the standby")
	close(releaseFirst)

	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, stand.State(), machineID)

		return err == nil && st.TypedSpec().Value.GetReadyToUse()
	}, 2*time.Minute, 100*time.Millisecond, "the machine never became ready to use under the standby")
	t.Logf("the standby acted %s after the active controller was killed (lease %s); ready %s after the kill",
		tookOver.Round(10*time.Millisecond), lease, time.Since(killed).Round(10*time.Millisecond))

	data, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{0}, 1<<20), data, "the disk was not zeroed")
	require.EqualValues(t, 1, wipesDone.Load(), "the wipe completed exactly once (%d calls)", wipeCalls.Load())
	require.EqualValues(t, 1, wipeCalls.Load(), "the standby sent the wipe again")

	powerMu.Lock()
	defer powerMu.Unlock()

	require.Empty(t, power, "the BMC saw power actions during accept and takeover")
	require.NotContains(t, b.log.String(), "lab-password")
}

// actingSpan is one term of a controller: when it logged that it acts and when it logged that it stopped (zero
// while it still acts).
type actingSpan struct {
	who         string
	start, stop time.Time
}

// actingSpans reads the terms out of a controller's JSON log.
func actingSpans(t *testing.T, who string, p *process) []actingSpan {
	t.Helper()

	var spans []actingSpan

	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	for sc.Scan() {
		var line struct {
			Msg string    `json:"msg"`
			TS  time.Time `json:"ts"`
		}

		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}

		switch {
		case line.Msg == "acting: this controller holds the lease":
			spans = append(spans, actingSpan{who: who, start: line.TS})
		case strings.HasPrefix(line.Msg, "stopped acting") || line.Msg == "lease given up":
			require.NotEmpty(t, spans, "%s stopped acting before it acted", who)
			spans[len(spans)-1].stop = line.TS
		}
	}

	return spans
}

// TestBinariesCutOffControllerStopsBeforeStandbyActs runs two controller binaries against the Omni stand-in,
// the first one through a proxy that can cut it off from Omni while it stays alive, and an edge given both
// addresses. Cut off, the first stops acting before the second acts; the edge follows the second; mended, the
// first stays a standby. From both logs: at no moment do two controllers act.
func TestBinariesCutOffControllerStopsBeforeStandbyActs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped with -short")
	}

	t.Parallel()

	bin := buildBinaries(t)
	stand, omniLn := serveStandIn(t)
	proxy := linklab.StartProxy(t, omniLn.Addr().String())

	const lease = 3 * time.Second

	// Controller a reaches Omni through the proxy, b directly.
	pair := startStandbyPair(t, bin, stand, proxy.Addr, omniLn.Addr().String(), lease)
	a, b, dirA, dirB, addrB, edge := pair.a, pair.b, pair.dirA, pair.dirB, pair.addrB, pair.edge

	// The first controller stays up, but nothing it sends reaches Omni any more.
	cut := time.Now()

	proxy.SetBlackhole(true)
	proxy.Cut()

	require.Eventually(t, actingCheck(b), 30*time.Second, 50*time.Millisecond, "the standby did not act within 30 s of the cut")
	tookOver := time.Since(cut)

	require.Eventually(t, func() bool { return edge.hasLine("uplink connected", "controller", addrB) }, time.Minute, 50*time.Millisecond,
		"the edge did not reconnect to the standby")

	// Mended, the first controller finds the lease held and stays a standby.
	proxy.SetBlackhole(false)
	proxy.Cut()
	require.Never(t, func() bool { return len(actingSpans(t, "a", a)) > 1 }, 3*lease, 100*time.Millisecond,
		"the first controller acted again while the second held the lease")

	spansA, spansB := actingSpans(t, "a", a), actingSpans(t, "b", b)
	require.Len(t, spansA, 1)
	require.Len(t, spansB, 1)
	require.False(t, spansA[0].stop.IsZero(), "the cut-off controller never logged that it stopped acting")

	t.Logf("cut at %s; a acted %s - %s; b acted from %s (%s after the cut, lease %s); a stopped %s before b acted",
		cut.UTC().Format(time.StampMilli), spansA[0].start.UTC().Format(time.StampMilli), spansA[0].stop.UTC().Format(time.StampMilli),
		spansB[0].start.UTC().Format(time.StampMilli), tookOver.Round(10*time.Millisecond), lease,
		spansB[0].start.Sub(spansA[0].stop).Round(time.Millisecond))

	require.True(t, spansA[0].stop.Before(spansB[0].start), "both controllers acted at once")
	require.True(t, a.hasLine("lease lost: stopping", "reason", ""), "the cut-off controller gave no reason for stopping")

	// Asked through the standby's admin socket, the site list names the acting controller instead of calling
	// every site offline; the acting one's shows the site connected.
	siteList := func(stateDir string) string {
		out, err := exec.Command(filepath.Join(bin, "controller"), "--state-dir", stateDir, "site", "list").CombinedOutput()
		require.NoError(t, err, "%s", out)

		return string(out)
	}

	listA := siteList(dirA)
	t.Logf("site list on the standby:\n%s", listA)
	require.Contains(t, listA, "this controller stands by; the acting one is ")
	require.Contains(t, listA, "(uplink "+addrB+")")
	require.Regexp(t, `lab-site\s+enrolled`, listA)
	require.Regexp(t, `lab-site\s+connected`, siteList(dirB))

	// A site revoked through the standby loses its session on the acting controller.
	out, err := exec.Command(filepath.Join(bin, "controller"), "--state-dir", dirA, "site", "revoke", "lab-site").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Eventually(t, func() bool { return b.hasLine("site revoked or deleted: ending its session", "site", "lab-site") },
		10*time.Second, 50*time.Millisecond, "the acting controller kept the revoked site's session")
	require.Eventually(t, func() bool { return edge.hasLine("uplink rejected", "", "") }, 30*time.Second, 50*time.Millisecond,
		"the edge of the revoked site was not refused")
}

// actingCheck reports whether the controller logged that it acts.
func actingCheck(p *process) func() bool {
	return func() bool { return p.hasLine("acting: this controller holds the lease", "", "") }
}

// standbyPair is two controller binaries of one provider (each with a state directory of its own) and an edge
// given both addresses, enrolled through the first and connected to it.
type standbyPair struct {
	a, b         *process
	dirA, dirB   string
	addrA, addrB string
	edge         *process
}

// startStandbyPair starts controller a (reaching Omni at omniA) and, once it acts, controller b (at omniB),
// checks that b stands by while a renews, creates a site through a and starts its edge with both addresses.
func startStandbyPair(t *testing.T, bin string, stand *omni.Server, omniA, omniB string, lease time.Duration) standbyPair {
	t.Helper()

	installDir := t.TempDir()
	controller := func(omniAddr string) (*process, string, string) {
		stateDir := t.TempDir()
		p := startProcess(t, []string{"OMNI_SERVICE_ACCOUNT_KEY=" + stand.ProviderKey()}, filepath.Join(bin, "controller"),
			"--state-dir", stateDir, "--uplink-listen", "127.0.0.1:0", "--http-listen", "",
			"--omni-endpoint", "grpc://"+omniAddr, "--install-assets-dir", installDir,
			"--poll-interval", "1s", "--power-cooldown", "2s", "--lease-duration", lease.String(), "--log-level", "debug")

		return p, stateDir, p.logField(t, "controller built", "uplink")
	}

	var pair standbyPair

	pair.a, pair.dirA, pair.addrA = controller(omniA)
	require.Eventually(t, actingCheck(pair.a), time.Minute, 50*time.Millisecond, "the first controller never acted")

	pair.b, pair.dirB, pair.addrB = controller(omniB)
	require.Never(t, actingCheck(pair.b), 2*lease, 100*time.Millisecond, "the second controller acted while the first renewed")

	out, err := exec.Command(filepath.Join(bin, "controller"), "--state-dir", pair.dirA, "site", "create", "lab-site").Output()
	require.NoError(t, err)

	token := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])

	ipxeDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "undionly.kpxe"), []byte("stand-in"), 0o644))

	pair.edge = startProcess(t, nil, filepath.Join(bin, "edge"), "--state-dir", t.TempDir(), "--controller", pair.addrA+","+pair.addrB,
		"--join-token", token, "--http-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--tftp-listen", "",
		"--ipxe-dir", ipxeDir, "--log-level", "debug")
	require.Eventually(t, func() bool { return pair.edge.hasLine("uplink connected", "controller", pair.addrA) }, time.Minute, 50*time.Millisecond)

	return pair
}
