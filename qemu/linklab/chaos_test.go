package linklab_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/resources"
	edgeintents "github.com/outpost-metal/outpost/edge/intents"
	"github.com/outpost-metal/outpost/qemu/linklab"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/qemu/testagent"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// chaosTypes are the controller's resource types under the stand-in's provider ID.
var chaosTypes = resources.NewTypes("bare-metal")

// chaosTalos is the Talos version the chaos machines install.
const chaosTalos = "v1.11.5"

// TestChaos runs the real controller and edge binaries against the Omni stand-in with CHAOS_MACHINES machines
// (test agents with disk files, virtual IPMI BMCs) cycling through accept, wipe, allocate, install and release
// for the whole run, while the uplink is cut at random (0.5-4 s apart, CHAOS_CUTS cuts), every other wipe and
// BMC reset has its reply lost (the uplink is cut the moment the machine has done it), and the controller and
// the edge are killed (SIGKILL) and started again at random moments (CHAOS_KILLS kills, alternating). It
// counts every wipe each agent carried out (by machine and by the intent ID it carried) and every reset each
// BMC received, against what Omni asked for and what the controllers logged deciding, and prints
//
//	CHAOS cuts=<n> kills=<n> machines=<n> wipes_extra=<n> wipes_missing=<n> power_extra=<n> lost_intents=<n> ...
//
// requiring those four to be zero. `make chaos` runs 100 cuts and 10 kills; make test the default 20 and 2.
// CHAOS_DEBUG=1 logs each machine's boots and runs the controller at debug level; LINKLAB_BINARIES runs
// binaries built elsewhere (an older commit) under the same faults. Logs: _out/chaos.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries for minutes; skipped with -short")
	}

	cuts, kills, n := envInt(t, "CHAOS_CUTS", 20), envInt(t, "CHAOS_KILLS", 2), envInt(t, "CHAOS_MACHINES", 4)

	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(cuts)*6*time.Second+10*time.Minute)
	defer cancel()

	require.NoError(t, chaosTypes.Register())

	bin := buildBinaries(t)
	stand, omniLn := serveStandIn(t)
	admin := omni.NewAdmin(stand.State())

	// Local install assets for the machines' profile (no extensions), so install boots need nothing upstream.
	installDir := t.TempDir()
	schematic, err := assets.SchematicID(assets.Profile{TalosVersion: chaosTalos})
	require.NoError(t, err)

	for _, v := range []string{chaosTalos, strings.TrimPrefix(chaosTalos, "v")} {
		dir := filepath.Join(installDir, schematic, v)
		require.NoError(t, os.MkdirAll(dir, 0o755))

		for _, f := range []string{"kernel-amd64", "initramfs-amd64.xz"} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("chaos "+f), 0o644))
		}
	}

	// The agent-mode image every site caches (a stand-in: the machines here only read their boot script).
	agentDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(agentDir, "x86_64"), 0o755))

	for _, f := range []string{"vmlinuz", "initramfs.xz"} {
		require.NoError(t, os.WriteFile(filepath.Join(agentDir, "x86_64", f), []byte("chaos agent "+f), 0o644))
	}

	// The controller on a fixed address (it is restarted there), the edge behind a proxy that cuts the uplink.
	stateDir, uplinkAddr := t.TempDir(), freeLoopbackPort(t)
	ctlArgs := []string{
		"--state-dir", stateDir, "--uplink-listen", uplinkAddr, "--http-listen", "",
		"--omni-endpoint", "grpc://" + omniLn.Addr().String(), "--install-assets-dir", installDir,
		"--agent-assets-dir", agentDir, "--poll-interval", "1s", "--power-cooldown", "2s", "--log-level", chaosLogLevel(),
	}
	ctlEnv := []string{"OMNI_SERVICE_ACCOUNT_KEY=" + stand.ProviderKey()}
	ctl := startProcess(t, ctlEnv, filepath.Join(bin, "controller"), ctlArgs...)
	ctl.logField(t, "controller built", "uplink")

	out, err := runController(ctx, bin, stateDir, "site", "create", "chaos")
	require.NoError(t, err, "%s", out)

	token := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
	proxy := linklab.StartProxy(t, uplinkAddr)
	tally := &chaosTally{byMachine: map[string]int{}, byIntent: map[string]int{}}
	chaosStarted := atomic.Bool{}
	tally.drop = func() {
		if chaosStarted.Load() {
			proxy.Cut()
		}
	}

	ipxeDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "undionly.kpxe"), []byte("stand-in"), 0o644))

	edgeDir, httpAddr, apiAddr := t.TempDir(), freeLoopbackPort(t), freeLoopbackPort(t)
	edgeArgs := []string{
		"--state-dir", edgeDir, "--controller", proxy.Addr, "--join-token", token,
		"--http-listen", httpAddr, "--api-listen", apiAddr, "--tftp-listen", "", "--ipxe-dir", ipxeDir, "--log-level", "info",
	}
	edge := startProcess(t, nil, filepath.Join(bin, "edge"), edgeArgs...)
	edge.logField(t, "edge starting", "http")

	joinToken, err := admin.JoinToken(ctx, "bare-metal")
	require.NoError(t, err)

	machines := make([]*chaosMachine, n)

	for i := range machines {
		m := newChaosMachine(t, i, httpAddr, apiAddr, stand.State(), tally)
		machines[i] = m

		provision(ctx, t, omniLn.Addr().String(), joinToken, m.id)
		require.NoError(t, admin.SetBMCConfig(ctx, m.id, &specs.InfraMachineBMCConfigSpec_IPMI{
			Address: "127.0.0.1", Port: uint32(m.bmcPort), Username: "admin", Password: "chaos-password",
		}))
		require.NoError(t, admin.Accept(ctx, m.id))
	}

	// The machines cycle until the faults are over, then come to rest ready.
	var (
		stopping atomic.Bool
		wg       sync.WaitGroup
	)

	for _, m := range machines {
		wg.Go(func() { m.cycle(ctx, &stopping) })
	}

	ctls, edges := []*process{ctl}, []*process{edge}
	started := time.Now()
	chaosStarted.Store(true)
	done := chaos(ctx, t, chaosPlan{cuts: cuts, kills: kills}, proxy, func(which int) {
		if which%2 == 0 {
			ctl = restartProcess(t, ctl, ctlEnv, filepath.Join(bin, "controller"), ctlArgs)
			ctls = append(ctls, ctl)
		} else {
			edge = restartProcess(t, edge, nil, filepath.Join(bin, "edge"), edgeArgs)
			edges = append(edges, edge)
		}
	})
	chaosTime := time.Since(started)

	chaosStarted.Store(false)
	stopping.Store(true)
	wg.Wait()

	// Quiet: every machine ready, every intent closed.
	openIntents := func() int {
		open := 0

		for _, m := range machines {
			if w, err := safe.StateGet[*resources.WipeStatus](ctx, stand.State(), chaosTypes.NewWipeStatus(m.id).Metadata()); err == nil && w.TypedSpec().Value.GetOpenIntent() != nil {
				open++
			}

			if r, err := safe.StateGet[*resources.RebootStatus](ctx, stand.State(), chaosTypes.NewRebootStatus(m.id).Metadata()); err == nil && r.TypedSpec().Value.GetOpenIntent() != nil {
				open++
			}
		}

		return open
	}

	settled := waitUntil(ctx, 3*time.Minute, func() bool {
		for _, m := range machines {
			if !m.ready(ctx) {
				return false
			}
		}

		return openIntents() == 0
	})

	for _, m := range machines {
		asked, done := m.wipeIDs(ctx)
		var obs, reboot string

		if o, err := safe.StateGet[*resources.MachineObservation](ctx, stand.State(), chaosTypes.NewMachineObservation(m.id).Metadata()); err == nil {
			obs = o.TypedSpec().Value.String()
		}

		if r, err := safe.StateGet[*resources.RebootStatus](ctx, stand.State(), chaosTypes.NewRebootStatus(m.id).Metadata()); err == nil {
			reboot = r.TypedSpec().Value.String()
		}

		t.Logf("machine %s: wipe asked %q done %q, ready %v, power %v, installs %d, releases %d, resets %d; observation {%s}; reboot {%s}",
			m.id, asked, done, m.status(ctx).GetReadyToUse(), m.chassis.PowerState(), m.installs.Load(), m.releases.Load(), m.resets.Load(), obs, reboot)
	}

	// Every process's log, for reading after the run.
	logDir, err := filepath.Abs("../../_out/chaos")
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(logDir, 0o755))

	for i, p := range append(ctls, edges...) {
		name := fmt.Sprintf("%s-%d.log", filepath.Base(p.cmd.Path), i)
		require.NoError(t, os.WriteFile(filepath.Join(logDir, name), []byte(p.log.String()), 0o644)) // a report
	}

	// What the edge carried out, from its own record.
	data, err := os.ReadFile(filepath.Join(edgeDir, edgeintents.FileName))
	if !errors.Is(err, os.ErrNotExist) { // an edge that keeps no intents (an older release, LINKLAB_BINARIES)
		require.NoError(t, err)
	}

	outcomes, _ := edgeintents.DecodeAll(data)
	last := map[string]*intentspb.IntentOutcome{}

	for _, o := range outcomes {
		last[o.GetIntentId()] = o
	}

	// Wipes the edge could not say were carried out (it restarted during them) are done again, under a new
	// intent and with an alert in the machine's timeline: counted apart.
	interrupted := map[string]int{}

	for _, o := range last {
		if o.GetState() == intentspb.State_STATE_INTERRUPTED && strings.HasSuffix(o.GetOp(), "/WipeDisks") {
			interrupted[o.GetMachineId()]++
		}
	}

	// The reboots the controllers decided and carried out, from their logs (one line each, whichever process).
	reboots := map[string]int{}

	for _, p := range ctls {
		for _, id := range p.lineFields("machine", "rebooted", "recorded a reboot the edge carried out before its answer was lost") {
			reboots[id]++
		}
	}

	var wipesExtra, wipesMissing, powerExtra, rewipes, cycles, resets, wipes, dups int

	tally.mu.Lock()
	for _, c := range tally.byIntent {
		dups += c - 1
	}

	for _, m := range machines {
		want := int(m.releases.Load()) + 1 // the wipe on acceptance, and one after each release
		got := tally.byMachine[m.id]
		wipes += got
		rewipes += min(interrupted[m.id], max(0, got-want))
		wipesExtra += max(0, got-want-interrupted[m.id])
		wipesMissing += max(0, want-got)
		cycles += int(m.releases.Load())
		resets += int(m.resets.Load())
		powerExtra += max(0, int(m.resets.Load())-reboots[m.id])
	}
	tally.mu.Unlock()

	lost := openIntents()

	line := fmt.Sprintf("CHAOS cuts=%d kills=%d machines=%d wipes_extra=%d wipes_missing=%d power_extra=%d lost_intents=%d "+
		"replies_dropped=%d cycles=%d wipes=%d same_intent_twice=%d resets=%d reboots_decided=%d rewipes_alerted=%d chaos_s=%.0f settled=%v",
		done.cuts, done.kills, n, wipesExtra, wipesMissing, powerExtra, lost, tally.drops.Load(), cycles, wipes, dups, resets, sum(reboots), rewipes,
		chaosTime.Seconds(), settled)
	fmt.Println(line)
	t.Log(line)

	require.True(t, settled, "the machines did not all come to rest ready with no open intent within 3 minutes of the last fault")
	require.Zero(t, wipesExtra, "a wipe was carried out twice")
	require.Zero(t, wipesMissing, "a wipe Omni asked for was not carried out")
	require.Zero(t, dups, "the edge carried out an intent twice")
	require.Zero(t, powerExtra, "a machine was power-cycled more often than the controllers decided")
	require.Zero(t, lost, "intents left open")
	require.GreaterOrEqual(t, cycles, n, "the machines did not cycle through allocate, install and release")
}

type chaosPlan struct{ cuts, kills int }

// chaos cuts the uplink plan.cuts times, 0.5-4 s apart, and calls kill (0, 1, ...) plan.kills times spread
// over the run, each at a random moment between two cuts.
func chaos(ctx context.Context, t *testing.T, plan chaosPlan, proxy *linklab.Proxy, kill func(which int)) chaosPlan {
	t.Helper()

	var done chaosPlan

	every := max(1, plan.cuts/max(1, plan.kills))

	for i := 1; i <= plan.cuts; i++ {
		pause := 500*time.Millisecond + rand.N(3500*time.Millisecond)

		select {
		case <-ctx.Done():
			return done
		case <-time.After(pause):
		}

		proxy.Cut()
		done.cuts++

		if done.kills < plan.kills && i%every == 0 {
			select {
			case <-ctx.Done():
				return done
			case <-time.After(rand.N(pause)):
			}

			kill(done.kills)
			done.kills++
			t.Logf("chaos: cut %d, kill %d (%s)", i, done.kills, map[bool]string{true: "controller", false: "edge"}[done.kills%2 == 1])
		}
	}

	return done
}

// restartProcess kills p (SIGKILL: no clean shutdown) and starts the same binary again with the same arguments.
func restartProcess(t *testing.T, p *process, env []string, name string, args []string) *process {
	t.Helper()

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	p.cmd.Wait() //nolint:errcheck // killed

	return startProcess(t, env, name, args...)
}

func runController(ctx context.Context, bin, stateDir string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	out, err := exec.CommandContext(cctx, filepath.Join(bin, "controller"), append([]string{"--state-dir", stateDir}, args...)...).CombinedOutput()

	return string(out), err
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()

	v := os.Getenv(name)
	if v == "" {
		return def
	}

	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s", name)

	return n
}

// waitUntil polls cond until it holds or within ends.
func waitUntil(ctx context.Context, within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)

	for time.Now().Before(deadline) && ctx.Err() == nil {
		if cond() {
			return true
		}

		time.Sleep(200 * time.Millisecond)
	}

	return cond()
}

// chaosTally counts the wipes the agents carried out, by machine and by the intent ID each carried.
type chaosTally struct {
	mu        sync.Mutex
	byMachine map[string]int
	byIntent  map[string]int
	// drop loses the reply of every other call that reaches a machine (its wipe, its BMC's reset): the uplink
	// is cut when the call is done, before its answer leaves.
	drop  func()
	drops atomic.Int32
}

// maybeDrop cuts the uplink now, every other time: the call that is done is answered into a cut link.
func (c *chaosTally) maybeDrop() {
	if c.drop == nil || rand.IntN(2) == 0 {
		return
	}

	c.drops.Add(1)
	c.drop()
}

func (c *chaosTally) wipe(ctx context.Context, machine string) error {
	md, _ := metadata.FromIncomingContext(ctx)

	c.mu.Lock()
	defer c.mu.Unlock()

	c.byMachine[machine]++

	if ids := md.Get(intentspb.MetadataKey); len(ids) == 1 {
		c.byIntent[ids[0]]++
	}

	return nil
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}

	return n
}

// lineFields returns field of every JSON log line of the process whose message is one of msgs.
func (p *process) lineFields(field string, msgs ...string) []string {
	var out []string

	sc := bufio.NewScanner(strings.NewReader(p.log.String()))
	sc.Buffer(nil, 1<<20)

	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}

		if msg, _ := line["msg"].(string); slices.Contains(msgs, msg) {
			v, _ := line[field].(string)
			out = append(out, v)
		}
	}

	return out
}

// chaosMachine is a machine for the chaos run: powered by its virtual BMC, it asks the edge for its boot script
// from its own loopback address at every power-on and does what the script says: agent mode runs the test
// agent, an install reports the install to Omni and then runs Talos from disk, a disk boot runs Talos, a wait
// asks again a second later.
type chaosMachine struct {
	t       *testing.T
	id      string
	src     string
	http    string
	admin   *omni.Admin
	st      state.State
	agent   testagent.Config
	chassis *vbmc.Chassis
	bmcPort int
	tally   *chaosTally

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	installs atomic.Int32
	releases atomic.Int32
	resets   atomic.Int32
}

func newChaosMachine(t *testing.T, i int, httpAddr, apiAddr string, st state.State, tally *chaosTally) *chaosMachine {
	t.Helper()

	m := &chaosMachine{
		t: t, id: fmt.Sprintf("c4a05000-0000-4000-8000-%012x", i+1), src: fmt.Sprintf("127.0.1.%d", i+1),
		http: httpAddr, admin: omni.NewAdmin(st), st: st, tally: tally,
	}

	disk := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xa5}, 64<<10), 0o600))

	m.agent = testagent.Config{
		Endpoint: apiAddr, MachineID: m.id, Disks: []string{disk}, Source: m.src,
		RetryInterval: 200 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)),
		BeforeWipe: func(ctx context.Context) error { return tally.wipe(ctx, m.id) },
		AfterWipe:  func(context.Context) { tally.maybeDrop() },
	}

	m.chassis = vbmc.NewChassis(vbmc.WithHook(m.hook))
	require.NoError(t, m.chassis.SetPower(t.Context(), true))

	conn := serveIPMI(t, m.chassis, "admin", "chaos-password")
	m.bmcPort = conn.LocalAddr().(*net.UDPAddr).Port

	t.Cleanup(m.stop)

	return m
}

func (m *chaosMachine) hook(_ context.Context, action vbmc.Action, _ vbmc.Override) error {
	switch action {
	case vbmc.ActionPowerOff:
		m.stop()
	case vbmc.ActionReset:
		m.resets.Add(1)
		m.tally.maybeDrop()
		m.stop()
		m.start()
	case vbmc.ActionPowerOn:
		m.stop()
		m.start()
	}

	return nil
}

// start runs the machine's boot apart from the BMC's call.
func (m *chaosMachine) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})

	m.mu.Lock()
	m.cancel, m.done = cancel, done
	m.mu.Unlock()

	go func() {
		defer close(done)

		m.run(ctx)
	}()
}

func (m *chaosMachine) stop() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel, m.done = nil, nil
	m.mu.Unlock()

	if cancel != nil {
		cancel()
		<-done
	}
}

func (m *chaosMachine) run(ctx context.Context) {
	for ctx.Err() == nil {
		script, err := m.bootScript(ctx)
		if os.Getenv("CHAOS_DEBUG") != "" {
			first, _, _ := strings.Cut(strings.TrimPrefix(script, "#!ipxe\n"), "\n")
			m.t.Logf("%s %s boots: %q %v", time.Now().Format("15:04:05.000"), m.id[len(m.id)-2:], first, err)
		}

		switch {
		case err == nil && strings.Contains(script, "edge: agent mode"):
			agent, err := testagent.New(m.agent)
			if err != nil {
				m.t.Errorf("test agent: %v", err)

				return
			}

			agent.Run(ctx) //nolint:errcheck // until powered off

			return
		case err == nil && strings.Contains(script, "edge: install "):
			// The installer writes Talos to disk; Talos reports the install to Omni and runs from disk.
			for ctx.Err() == nil {
				if err = m.admin.ReportInstalled(ctx, m.id); err == nil {
					m.installs.Add(1)

					break
				}

				pauseCtx(ctx, 200*time.Millisecond)
			}

			<-ctx.Done()

			return
		case errors.Is(err, errDiskBoot) || err == nil && strings.Contains(script, "boot from disk"):
			<-ctx.Done() // Talos from disk (a 404 is the edge's disk hand-off)

			return
		default: // a wait script, or the edge is restarting: ask again, as the script's retry does
			pauseCtx(ctx, time.Second)
		}
	}
}

// errDiskBoot is the edge's answer that sends a machine to its disk (HTTP 404: iPXE's chain fails, the firmware
// boots the next device).
var errDiskBoot = errors.New("boot from disk")

// bootScript asks the edge for the machine's boot script from its own address, as its iPXE would.
func (m *chaosMachine) bootScript(ctx context.Context) (string, error) {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(m.src)}}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext}}

	defer client.CloseIdleConnections()

	mac := fmt.Sprintf("52-54-00-c4-00-%02x", m.src[len(m.src)-1])
	q := url.Values{"uuid": {m.id}, "mac": {mac}, "arch": {"x86_64"}}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.http+"/ipxe/boot.ipxe?"+q.Encode(), nil)
	if err != nil {
		return "", err
	}

	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close() //nolint:errcheck

	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusNotFound {
		return "", errDiskBoot
	}

	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("boot script: %s: %w", resp.Status, err)
	}

	return string(body), nil
}

func (m *chaosMachine) status(ctx context.Context) *specs.InfraMachineStatusSpec {
	st, err := safe.StateGetByID[*infra.MachineStatus](ctx, m.st, m.id)
	if err != nil {
		return nil
	}

	return st.TypedSpec().Value
}

// wipeIDs returns the wipe ID Omni asks for and the one the controller recorded as done.
func (m *chaosMachine) wipeIDs(ctx context.Context) (asked, done string) {
	if im, err := safe.StateGetByID[*infra.Machine](ctx, m.st, m.id); err == nil {
		asked = im.TypedSpec().Value.GetWipeId()
	}

	if w, err := safe.StateGet[*resources.WipeStatus](ctx, m.st, chaosTypes.NewWipeStatus(m.id).Metadata()); err == nil && w.TypedSpec().Value.GetWipedAt() != nil {
		done = w.TypedSpec().Value.GetLastWipeId()
	}

	return asked, done
}

// ready: ready to use, with the wipe Omni asks for done.
func (m *chaosMachine) ready(ctx context.Context) bool {
	asked, done := m.wipeIDs(ctx)

	return asked == done && m.status(ctx).GetReadyToUse()
}

// cycle takes the machine through allocate, install and release again and again until stopping is set; each
// wait is bounded, and a machine that does not get there is left for the final check to report.
func (m *chaosMachine) cycle(ctx context.Context, stopping *atomic.Bool) {
	for n := 0; ctx.Err() == nil && !stopping.Load(); n++ {
		if !waitUntil(ctx, 3*time.Minute, func() bool { return m.ready(ctx) || stopping.Load() }) || stopping.Load() {
			return
		}

		installs := m.installs.Load()

		if err := m.admin.Allocate(ctx, m.id, "chaos-"+m.id[len(m.id)-4:], chaosTalos, nil, false); err != nil {
			m.t.Logf("allocate %s: %v", m.id, err)

			return
		}

		if !waitUntil(ctx, 3*time.Minute, func() bool { return m.installs.Load() > installs }) {
			m.t.Logf("machine %s was not installed within 3 minutes of its allocation", m.id)
		}

		before, _ := m.wipeIDs(ctx)

		if err := m.admin.Release(ctx, m.id); err != nil {
			m.t.Logf("release %s: %v", m.id, err)

			return
		}

		m.releases.Add(1)

		// Omni resets the released machine and asks for a new wipe: the next cycle starts once that is done.
		if !waitUntil(ctx, time.Minute, func() bool { asked, _ := m.wipeIDs(ctx); return asked != before }) {
			m.t.Logf("Omni set no new wipe ID for %s within a minute of its release", m.id)
		}
	}
}

func pauseCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// chaosLogLevel is the controller's log level: debug with CHAOS_DEBUG set.
func chaosLogLevel() string {
	if os.Getenv("CHAOS_DEBUG") != "" {
		return "debug"
	}

	return "info"
}
