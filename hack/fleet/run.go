package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/pkg/client"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/qemu/omni"
)

// providerID is the infra provider the controller runs as.
const providerID = "bare-metal"

// Result is what a run measured; Summary renders its one line.
type Result struct {
	Config  Config    `json:"config"`
	Started time.Time `json:"started"`
	// ControllerVersion is what the controller binary says of itself (--version).
	ControllerVersion string `json:"controller_version"`
	// LoadAverage is the machine's 1-, 5- and 15-minute load at the start and the end of the run.
	LoadAverage []string `json:"load_average"`

	Sites        int `json:"sites"`
	Machines     int `json:"machines"`
	DeadBMCs     int `json:"dead_bmcs"`
	OfflineSites int `json:"offline_sites"`
	// FlappingSites lost their link every FlapEvery, Flaps times in all.
	FlappingSites int `json:"flapping_sites"`
	Flaps         int `json:"flaps"`
	// Unreachable machines (dead BMC, offline or flapping site) are left out of the power age and the samples.
	Unreachable int `json:"unreachable"`

	// Phases are seconds from the run's start to each milestone.
	Phases map[string]float64 `json:"phases"`
	// ReadyToUse machines when the steady state began (of Machines).
	ReadyToUse int `json:"ready_to_use"`

	Steady  Steady  `json:"steady"`
	Intent  Intent  `json:"intent"`
	Restart Restart `json:"restart"`

	// Perf names the profile files written (empty without perf).
	Perf []string `json:"perf,omitempty"`
}

// Steady is the steady-state window.
type Steady struct {
	WindowS float64 `json:"window_s"`
	// ControllerCores is the controller's CPU over the window divided by wall time; RSSMiB its RSS at the end.
	ControllerCores  float64 `json:"controller_cores"`
	ControllerRSSMiB float64 `json:"controller_rss_mib"`
	// SimulatorCores and OmniCores are the simulator's own process and the stand-in's child process.
	SimulatorCores float64 `json:"simulator_cores"`
	OmniCores      float64 `json:"omni_cores"`
	// OmniReadsPerS are the controller's Get, List and Watch calls to Omni per second; OmniCallsPerS every
	// method of the provider's identity.
	OmniReadsPerS float64            `json:"omni_reads_per_s"`
	OmniCallsPerS map[string]float64 `json:"omni_calls_per_s"`
	// PowerAge is, over the reachable machines, the age in seconds of the power state the controller last
	// learned: now minus the BMC's last PowerStatus answer, at the window's end. PowerAgeNever counts reachable
	// machines whose BMC never answered one.
	PowerAge      Dist   `json:"power_age_s"`
	PowerAgeNever int    `json:"power_age_never"`
	PowerAgeFrom  string `json:"power_age_from"`
	// ObservedAtSet counts MachineObservation records in Omni with observed_at set.
	ObservedAtSet int `json:"observed_at_set"`
	// BMCCallsPerS are the calls the simulated BMCs received per second over the window, by method; AgentTunnels
	// the agents with a tunnel up at the end.
	BMCCallsPerS map[string]float64 `json:"bmc_calls_per_s"`
	AgentTunnels int                `json:"agent_tunnels"`
	// TimelinePending is the controller's outpost_timeline_pending_writes at the window's start and end (the
	// ramp's timeline writes still to do; -1: a controller without the metric).
	TimelinePending [2]float64 `json:"timeline_pending_writes"`
}

// Intent is the user's power-on and reboot requests timed from Omni to the BMC.
type Intent struct {
	// AllMS, PowerOnMS and RebootMS are milliseconds from the request written to Omni to the matching call
	// received by the machine's BMC (PowerOn, PowerCycle).
	AllMS     Dist `json:"all_ms"`
	PowerOnMS Dist `json:"power_on_ms"`
	RebootMS  Dist `json:"reboot_ms"`
	// Missing requests never reached the BMC within IntentTimeout.
	Missing int `json:"missing"`
}

// Restart is a killed and restarted controller (same state directory, same addresses).
type Restart struct {
	// LocatedS is from the new process's start to the controller knowing every machine's site (its log: the
	// locations loaded from Omni cover them all, else the inventories of every online site are in).
	LocatedS        float64 `json:"located_s"`
	LocationsLoaded int     `json:"locations_loaded"`
	// ReconnectS is until outpost_uplink_sites_connected counts every online site.
	ReconnectS float64 `json:"reconnect_s"`
	// ObservedS is until the new process engaged every machine (ObservedFrom says how: the watch lists, or a
	// PowerStatus of each); Unobserved counts the sites or machines it did not within RestartTimeout.
	ObservedS    float64 `json:"observed_s"`
	ObservedFrom string  `json:"observed_from"`
	Unobserved   int     `json:"unobserved"`
}

// Summary is the run's one line; a run that ended before its steady-state window says so instead of figures.
func (r *Result) Summary() string {
	if r.Steady.WindowS == 0 {
		last, at := "start", 0.0

		for name, t := range r.Phases {
			if t > at {
				last, at = name, t
			}
		}

		return fmt.Sprintf("FLEET sites=%d machines=%d incomplete: ended after phase %s at %.0f s, %d of %d ready to use",
			r.Sites, r.Machines, last, at, r.ReadyToUse, r.Machines)
	}

	return fmt.Sprintf("FLEET sites=%d machines=%d cpu_cores=%.3f rss_mib=%.0f omni_reads_per_s=%.2f power_age_p99_s=%.1f intent_to_bmc_p99_ms=%.0f restart_located_s=%.2f reconnect_s=%.2f",
		r.Sites, r.Machines, r.Steady.ControllerCores, r.Steady.ControllerRSSMiB, r.Steady.OmniReadsPerS,
		r.Steady.PowerAge.P99, r.Intent.AllMS.P99, r.Restart.LocatedS, r.Restart.ReconnectS)
}

// Run runs the fleet against the controller binary and writes the figures to cfg.OutDir.
func Run(ctx context.Context, cfg Config, log *zap.Logger) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleet config: %w", err)
	}

	for _, d := range []string{cfg.WorkDir, cfg.OutDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}

	edgeLogFile, err := os.Create(filepath.Join(cfg.OutDir, "edges.log"))
	if err != nil {
		return nil, err
	}
	defer edgeLogFile.Close() //nolint:errcheck

	f, err := newFleet(cfg, log, edgeLogFile)
	if err != nil {
		return nil, err
	}
	defer f.closeOmniConns()

	r := &Result{Config: cfg, Started: time.Now(), Sites: cfg.Sites, Machines: cfg.Machines(), Phases: map[string]float64{}}
	phase := func(name string) {
		r.Phases[name] = time.Since(r.Started).Seconds()
		log.Info("phase", zap.String("phase", name), zap.Float64("at_s", r.Phases[name]))
	}

	if out, err := exec.CommandContext(ctx, cfg.ControllerBinary, "--version").Output(); err == nil { // the controller under test
		r.ControllerVersion = strings.TrimSpace(string(out))
	}

	r.LoadAverage = append(r.LoadAverage, loadAverage())
	runErr := f.run(ctx, r, phase)
	r.LoadAverage = append(r.LoadAverage, loadAverage())

	if err := writeResult(cfg.OutDir, r); err != nil {
		return r, errors.Join(runErr, err)
	}

	return r, runErr
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}

	f := strings.Fields(string(b))

	return strings.Join(f[:min(3, len(f))], " ")
}

func writeResult(dir string, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}

	if err := os.WriteFile(filepath.Join(dir, "fleet.json"), append(b, '\n'), 0o644); err != nil { // a report
		return err
	}

	return os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(r.Summary()+"\n"), 0o644) // a report
}

// one run, phase after phase
func (f *fleet) run(ctx context.Context, r *Result, phase func(string)) error {
	cfg, log := f.cfg, f.log

	// Omni stand-in, in a child process.
	omniLog, err := os.Create(filepath.Join(cfg.OutDir, "omni.log"))
	if err != nil {
		return err
	}
	defer omniLog.Close() //nolint:errcheck

	// In memory: the stand-in outlives the controller's restart, and a bolt file would add an fsync to every write.
	oc, err := startOmniChild(ctx, cfg.Self, "", cfg.OmniLatency, omniLog)
	if err != nil {
		return err
	}
	defer oc.stop()

	oclient, err := client.New(oc.endpoints.Endpoint, client.WithServiceAccount(oc.endpoints.AdminKey))
	if err != nil {
		return fmt.Errorf("admin client of the stand-in: %w", err)
	}
	defer oclient.Close() //nolint:errcheck

	f.admin = oclient.Omni().State()
	admin := omni.NewAdmin(f.admin)
	f.installed = admin.ReportInstalled

	phase("omni_up")

	// The controller.
	uplinkAddr, err := freeAddr()
	if err != nil {
		return err
	}

	httpAddr, err := freeAddr()
	if err != nil {
		return err
	}

	f.uplinkAddr = uplinkAddr
	stateDir := filepath.Join(cfg.WorkDir, "controller")
	installDir := filepath.Join(cfg.WorkDir, "install-assets")

	if err := os.MkdirAll(installDir, 0o755); err != nil {
		return err
	}

	args := f.controllerArgs(stateDir, uplinkAddr, httpAddr, oc.endpoints.Endpoint, installDir)
	env := []string{"OMNI_SERVICE_ACCOUNT_KEY=" + oc.endpoints.ProviderKey}

	ctl, err := startController(cfg.ControllerBinary, args, env, filepath.Join(cfg.OutDir, "controller.log"))
	if err != nil {
		return err
	}

	defer func() { ctl.stop() }()

	if err := ctl.waitHealthy(ctx, httpAddr, time.Minute); err != nil {
		return err
	}

	phase("controller_up")

	tokens, err := createSites(ctx, stateDir, cfg.Sites)
	if err != nil {
		return err
	}

	phase("sites_created")

	// The sites and their machines.
	dead := f.pick(cfg.Machines(), roundCount(cfg.Machines(), cfg.DeadBMCFraction))
	offline := f.pick(cfg.Sites, roundCount(cfg.Sites, cfg.OfflineSiteFraction))
	wantOn := f.pick(cfg.Machines(), roundCount(cfg.Machines(), cfg.OnFraction))
	r.DeadBMCs, r.OfflineSites = len(dead), len(offline)

	for i := range cfg.Sites {
		s, err := newSite(f, i, tokens[i])
		if err != nil {
			return fmt.Errorf("site %d: %w", i, err)
		}

		for j := range cfg.MachinesPerSite {
			n := i*cfg.MachinesPerSite + j
			m := &machine{site: s, id: machineID(n), mac: machineMAC(n), ip: machineAddr(n), index: n}
			if cfg.AgentConns == "site" {
				m.ip = s.ip
			}

			m.bmc = newSimBMC(bmcAddr(n), m, dead[n], &f.cfg.BMC, s.bmcs.cfg)
			s.bmcs.bmcs[m.bmc.key()] = m.bmc
			s.machines = append(s.machines, m)
			f.machines = append(f.machines, m)
		}

		f.sites = append(f.sites, s)
	}

	// the flapping sites are the last ones not offline
	flapping := map[int]bool{}
	for i := cfg.Sites - 1; i >= 0 && len(flapping) < cfg.FlappingSites; i-- {
		if !offline[i] {
			flapping[i] = true
		}
	}

	r.FlappingSites = len(flapping)

	reachable := func(m *machine) bool { return !m.bmc.dead && !offline[m.site.index] && !flapping[m.site.index] }

	for _, m := range f.machines {
		if !reachable(m) {
			r.Unreachable++
		}
	}

	sctx, stopSites := context.WithCancel(context.WithoutCancel(ctx))
	sites, sctx := errgroup.WithContext(sctx)

	for _, s := range f.sites {
		s.ctx = sctx
		sites.Go(func() error { return s.run(sctx) })
	}

	defer func() {
		stopSites()

		if err := sites.Wait(); err != nil {
			log.Warn("a site stopped with an error", zap.Error(err))
		}
	}()

	metricsURL := "http://" + httpAddr + "/metrics"

	if err := waitFor(ctx, 2*time.Minute, time.Second, func() (bool, error) {
		n, err := scrapeMetric(ctx, metricsURL, "outpost_uplink_sites_connected")

		return int(n) == cfg.Sites, err
	}); err != nil {
		return fmt.Errorf("sites connecting: %w", err)
	}

	phase("sites_connected")

	// Power the machines on (their site's in turn, at BootRate) while accepting them in Omni as they appear.
	accepted := newAcceptor(f, admin, wantOn)

	acceptCtx, stopAccepting := context.WithCancel(ctx)
	defer stopAccepting()

	acceptDone := make(chan error, 1)

	go func() { acceptDone <- accepted.run(acceptCtx) }()

	// In batches every 100 ms, so that the pace holds when timers run late on a busy machine.
	batch := max(1, cfg.BootRate/10)
	tick := time.NewTicker(100 * time.Millisecond)

	for i := 0; i < len(f.machines); i += batch {
		for _, m := range f.machines[i:min(i+batch, len(f.machines))] {
			m.powerOn()
		}

		if n := min(i+batch, len(f.machines)); n/(cfg.Machines()/10+1) != i/(cfg.Machines()/10+1) {
			log.Info("machines powered on", zap.Int("machines", n))
		}

		select {
		case <-ctx.Done():
			tick.Stop()

			return ctx.Err()
		case <-tick.C:
		}
	}

	tick.Stop()

	phase("machines_powered_on")

	readyDeadline := time.Now().Add(cfg.ReadyTimeout)

	if err := waitFor(ctx, time.Until(readyDeadline), 5*time.Second, func() (bool, error) {
		ready, err := f.readyCount(ctx)
		if err != nil {
			return false, err
		}

		var provisioned, agents, bmcUsers, watched int

		for _, m := range f.machines {
			if m.provisioned.Load() {
				provisioned++
			}

			if m.agentUp.Load() {
				agents++
			}

			if m.bmc.hasUsers() {
				bmcUsers++
			}
		}

		for _, s := range f.sites {
			if s.bmcs.watcher != nil {
				n, _, _ := s.bmcs.watcher.listState()
				watched += n
			}
		}

		log.Info("waiting for the fleet to be ready", zap.Int("provisioned", provisioned), zap.Int("accepted", accepted.count()),
			zap.Int("agents_up", agents), zap.Int("bmc_users_set", bmcUsers), zap.Int("bmcs_watched", watched),
			zap.Int("ready_to_use", ready), zap.Int("machines", cfg.Machines()))

		r.ReadyToUse = ready

		return ready == cfg.Machines(), nil
	}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}

		log.Warn("not every machine became ready to use; measuring anyway", zap.Int("ready_to_use", r.ReadyToUse), zap.Error(err))
	}

	phase("ready")

	stopAccepting()

	if err := <-acceptDone; err != nil {
		return err
	}

	// Power follows the user's wish: on for those kept on, off (after the cooldown) for the idle ones.
	if err := waitFor(ctx, cfg.Cooldown+3*cfg.PollInterval+2*time.Minute, 5*time.Second, func() (bool, error) {
		wrong := 0

		for _, m := range f.machines {
			if !m.bmc.dead && m.powered() != wantOn[m.index] {
				wrong++
			}
		}

		log.Info("waiting for power to follow the wish", zap.Int("machines_in_the_wrong_state", wrong))

		return wrong == 0, nil
	}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}

		log.Warn("power does not follow the wish for every machine; measuring anyway", zap.Error(err))
	}

	phase("power_settled")

	// The failures of the steady state: sites whose WAN link is down, and sites whose link keeps dropping.
	var (
		flapped sync.WaitGroup
		flaps   atomic.Int64
	)

	fctx, stopFlapping := context.WithCancel(ctx)
	defer stopFlapping()

	for _, s := range f.sites {
		switch {
		case offline[s.index]:
			s.wan.setDown(true)
		case flapping[s.index]:
			flapped.Go(func() { flaps.Add(int64(s.wan.flap(fctx, cfg.FlapEvery))) })
		}
	}

	if err := sleep(ctx, cfg.Settle); err != nil {
		return err
	}

	phase("steady")

	if err := f.steadyWindow(ctx, r, ctl, oc, metricsURL, reachable); err != nil {
		return err
	}

	phase("window_done")

	if err := f.intents(ctx, r, admin, reachable, wantOn); err != nil {
		return err
	}

	stopFlapping()
	flapped.Wait()

	r.Flaps = int(flaps.Load())

	phase("intents_done")

	ctl, err = f.restart(ctx, r, ctl, args, env, metricsURL, reachable)
	if err != nil {
		return err
	}

	phase("restart_done")

	return nil
}

// readyCount counts the InfraMachineStatuses ready to use.
func (f *fleet) readyCount(ctx context.Context) (int, error) {
	statuses, err := safe.StateListAll[*infra.MachineStatus](ctx, f.admin)
	if err != nil {
		return 0, fmt.Errorf("list infra machine statuses: %w", err)
	}

	ready := 0

	for st := range statuses.All() {
		if st.TypedSpec().Value.GetReadyToUse() {
			ready++
		}
	}

	return ready, nil
}

// steadyWindow measures the steady state: CPU and memory, Omni calls, BMC calls and the power state's age.
func (f *fleet) steadyWindow(ctx context.Context, r *Result, ctl *controllerProc, oc *omniChild, metricsURL string, reachable func(*machine) bool) error {
	cfg, log := f.cfg, f.log

	pending := func() float64 {
		n, err := scrapeMetric(ctx, metricsURL, "outpost_timeline_pending_writes")
		if err != nil {
			return -1
		}

		return n
	}

	r.Steady.TimelinePending[0] = pending()
	defer func() { r.Steady.TimelinePending[1] = pending() }()

	bmcBefore := f.bmcCalls()

	callsBefore, err := oc.calls(ctx)
	if err != nil {
		return err
	}

	// the controller's own counters, read outside the CPU samples (metrics-window.txt)
	seriesA, seriesErr := scrapeAll(ctx, metricsURL)

	ctlA, err := sampleCPU(ctl.pid())
	if err != nil {
		return err
	}

	simA, _ := sampleCPU(os.Getpid())
	omniA, _ := sampleCPU(oc.pid())

	var perf *exec.Cmd

	if cfg.Perf {
		if path, err := exec.LookPath("perf"); err == nil {
			out := filepath.Join(cfg.OutDir, "perf.data")
			perf = exec.Command(path, "record", "-F", "199", "-g", "-p", fmt.Sprint(ctl.pid()), "-o", out, "--", "sleep", // our own arguments
				fmt.Sprint(int(cfg.Window.Seconds())))
			perf.Stdout, perf.Stderr = nil, nil

			if err := perf.Start(); err != nil {
				log.Warn("perf record did not start", zap.Error(err))

				perf = nil
			}
		} else {
			log.Info("perf not installed: no profile of the controller")
		}
	}

	log.Info("steady-state window", zap.Duration("window", cfg.Window))

	if err := sleep(ctx, cfg.Window); err != nil {
		return err
	}

	ctlB, err := sampleCPU(ctl.pid())
	if err != nil {
		return err
	}

	simB, _ := sampleCPU(os.Getpid())
	omniB, _ := sampleCPU(oc.pid())

	f.writeWindowSeries(ctx, metricsURL, seriesA, seriesErr, ctlB.at.Sub(ctlA.at).Seconds())

	callsAfter, err := oc.calls(ctx)
	if err != nil {
		return err
	}

	bmcAfter := f.bmcCalls()
	now := time.Now()

	rss, err := procRSS(ctl.pid())
	if err != nil {
		return err
	}

	wall := ctlB.at.Sub(ctlA.at).Seconds()
	st := &r.Steady
	st.WindowS = wall
	st.ControllerCores = cores(ctlA, ctlB)
	st.ControllerRSSMiB = float64(rss) / (1 << 20)
	st.SimulatorCores = cores(simA, simB)
	st.OmniCores = cores(omniA, omniB)
	st.OmniCallsPerS = map[string]float64{}

	provider := omni.ProviderIdentity(providerID)
	before := map[string]uint64{}

	for _, c := range callsBefore {
		if c.Identity == provider {
			before[c.Method] = c.Count
		}
	}

	for _, c := range callsAfter {
		if c.Identity != provider {
			continue
		}

		rate := float64(c.Count-before[c.Method]) / wall
		st.OmniCallsPerS[c.Method] = rate

		if c.Method == "Get" || c.Method == "List" || c.Method == "Watch" {
			st.OmniReadsPerS += rate
		}
	}

	st.BMCCallsPerS = map[string]float64{}
	for k, v := range bmcAfter {
		st.BMCCallsPerS[k] = float64(v-bmcBefore[k]) / wall
	}

	var ages []float64

	for _, m := range f.machines {
		if m.agentUp.Load() {
			st.AgentTunnels++
		}

		if !reachable(m) {
			continue
		}

		last, _ := m.bmc.statusTimes()
		if last.IsZero() {
			st.PowerAgeNever++

			continue
		}

		ages = append(ages, now.Sub(last).Seconds())
	}

	st.PowerAge = distOf(ages)
	st.PowerAgeFrom = "bmc: the last PowerStatus each reachable machine's BMC answered, to the controller or to its edge's watcher " +
		"(which journals every change to the controller)"

	if n, err := f.observedAtSet(ctx); err == nil {
		st.ObservedAtSet = n
	} else {
		log.Warn("machine observations not read", zap.Error(err))
	}

	if perf != nil {
		if err := perf.Wait(); err != nil {
			log.Warn("perf record failed", zap.Error(err))
		} else {
			r.Perf = f.perfReports()
		}
	}

	log.Info("steady state measured", zap.Float64("controller_cores", st.ControllerCores), zap.Float64("rss_mib", st.ControllerRSSMiB),
		zap.Float64("simulator_cores", st.SimulatorCores), zap.Float64("omni_cores", st.OmniCores),
		zap.Float64("omni_reads_per_s", st.OmniReadsPerS), zap.Float64("power_age_p99_s", st.PowerAge.P99))

	return nil
}

// writeWindowSeries writes metrics-window.txt: how each of the controller's series changed over the window
// (from seriesA, scraped at its start; a failed scrape is logged, never fails the run).
func (f *fleet) writeWindowSeries(ctx context.Context, metricsURL string, seriesA map[string]float64, errA error, wall float64) {
	seriesB, err := scrapeAll(ctx, metricsURL)
	if err = errors.Join(errA, err); err != nil {
		f.log.Warn("controller metrics not read: no metrics-window.txt", zap.Error(err))

		return
	}

	out, err := os.Create(filepath.Join(f.cfg.OutDir, "metrics-window.txt"))
	if err == nil {
		err = errors.Join(writeSeriesRates(out, seriesA, seriesB, wall), out.Close())
	}

	if err != nil {
		f.log.Warn("metrics-window.txt not written", zap.Error(err))
	}
}

// observedAtSet counts the controller's MachineObservation records in Omni with observed_at set.
func (f *fleet) observedAtSet(ctx context.Context) (int, error) {
	types := resources.NewTypes(providerID)
	if err := types.Register(); err != nil {
		return 0, err
	}

	list, err := safe.StateList[*resources.MachineObservation](ctx, f.admin, types.NewMachineObservation("").Metadata())
	if err != nil {
		return 0, err
	}

	n := 0

	for o := range list.All() {
		if o.TypedSpec().Value.GetObservedAt().IsValid() {
			n++
		}
	}

	return n, nil
}

// perfReports renders the perf profile: the hottest functions by self time and with their callees.
func (f *fleet) perfReports() []string {
	data := filepath.Join(f.cfg.OutDir, "perf.data")
	files := []string{data}

	for name, extra := range map[string][]string{"perf-self.txt": {"--no-children"}, "perf-children.txt": {"--children"}} {
		out := filepath.Join(f.cfg.OutDir, name)
		args := append([]string{"report", "-i", data, "--stdio", "--sort", "symbol", "-g", "none", "--percent-limit", "0.5"}, extra...)

		b, err := exec.Command("perf", args...).Output() // our own arguments
		if err != nil {
			f.log.Warn("perf report failed", zap.Error(err))

			continue
		}

		if err := os.WriteFile(out, b, 0o644); err == nil { // a report
			files = append(files, out)
		}
	}

	sort.Strings(files)

	return files
}

func (f *fleet) bmcCalls() map[string]int {
	out := map[string]int{}

	for _, m := range f.machines {
		for k, v := range m.bmc.callCounts() {
			out[k] += v
		}
	}

	return out
}

// intents times the user's requests: a power-on for a machine that is off, a reboot for one that is on, spaced
// by IntentSpacing, over reachable machines spread across the fleet.
func (f *fleet) intents(ctx context.Context, r *Result, admin *omni.Admin, reachable func(*machine) bool, wantOn map[int]bool) error {
	cfg, log := f.cfg, f.log

	// Half power-ons of idle machines, half reboots of running ones (as far as there are both), interleaved.
	var offs, ons []*machine

	for _, m := range f.machines {
		last, _ := m.bmc.statusTimes()

		switch {
		case !reachable(m) || last.IsZero(): // unreachable, or never observed: the controller does not manage its power
		case m.powered():
			ons = append(ons, m)
		default:
			offs = append(offs, m)
		}
	}

	var sample []*machine

	pickOf := func(from []*machine, k int) []*machine {
		chosen := f.pick(len(from), k)
		idx := make([]int, 0, len(chosen))

		for i := range chosen {
			idx = append(idx, i)
		}

		sort.Ints(idx)

		out := make([]*machine, 0, len(idx))
		for _, i := range idx {
			out = append(out, from[i])
		}

		return out
	}

	a, b := pickOf(offs, (cfg.IntentSamples+1)/2), pickOf(ons, cfg.IntentSamples/2)
	for i := 0; i < len(a) || i < len(b); i++ {
		if i < len(a) {
			sample = append(sample, a[i])
		}

		if i < len(b) {
			sample = append(sample, b[i])
		}
	}

	var (
		mu                  sync.Mutex
		all, powerOn, boots []float64
		missing             atomic.Int64
		wg                  sync.WaitGroup
	)

	for _, m := range sample {
		on := m.powered()

		method := MethodPowerCycle
		if !on {
			method = MethodPowerOn
		}

		got := m.bmc.expect(method)
		t0 := time.Now()

		var err error

		if on {
			_, err = admin.Reboot(ctx, m.id)
		} else {
			err = admin.SetPowerState(ctx, m.id, "on")
			wantOn[m.index] = true
		}

		if err != nil {
			return fmt.Errorf("user request for %s: %w", m.id, err)
		}

		wg.Go(func() {
			select {
			case at := <-got:
				ms := float64(at.Sub(t0)) / float64(time.Millisecond)

				mu.Lock()
				all = append(all, ms)

				if method == MethodPowerOn {
					powerOn = append(powerOn, ms)
				} else {
					boots = append(boots, ms)
				}
				mu.Unlock()
			case <-time.After(cfg.IntentTimeout):
				missing.Add(1)
				log.Warn("user request never reached the bmc", zap.String("machine", m.id), zap.String("call", method))
			case <-ctx.Done():
			}
		})

		if err := sleep(ctx, cfg.IntentSpacing); err != nil {
			return err
		}
	}

	wg.Wait()

	r.Intent = Intent{AllMS: distOf(all), PowerOnMS: distOf(powerOn), RebootMS: distOf(boots), Missing: int(missing.Load())}

	log.Info("user requests timed", zap.Int("power_on", len(powerOn)), zap.Int("reboot", len(boots)), zap.Int("missing", r.Intent.Missing),
		zap.Float64("p99_ms", r.Intent.AllMS.P99))

	return nil
}

// restart kills the controller, starts it again with the same state and addresses, and times its return.
func (f *fleet) restart(ctx context.Context, r *Result, ctl *controllerProc, args, env []string, metricsURL string,
	reachable func(*machine) bool,
) (*controllerProc, error) {
	cfg, log := f.cfg, f.log

	online := 0

	for _, s := range f.sites {
		if !s.wan.isDown() {
			online++
		}
	}

	// Watched: the reachable machines whose power the old process observed.
	var watched []*machine

	for _, m := range f.machines {
		if last, _ := m.bmc.statusTimes(); reachable(m) && !last.IsZero() {
			watched = append(watched, m)
		}
	}

	ctl.kill()

	mark := time.Now()
	for _, m := range f.machines {
		m.bmc.markFrom(mark)
	}

	for _, s := range f.sites {
		if s.bmcs.watcher != nil {
			s.bmcs.watcher.markFrom(mark)
		}
	}

	next, err := startController(cfg.ControllerBinary, args, env, filepath.Join(cfg.OutDir, "controller-restarted.log"))
	if err != nil {
		return ctl, err
	}

	started := next.started
	deadline := started.Add(cfg.RestartTimeout)

	log.Info("controller killed and restarted")

	// Sessions: the uplink gauge.
	if err := waitFor(ctx, time.Until(deadline), 100*time.Millisecond, func() (bool, error) {
		n, err := scrapeMetric(ctx, metricsURL, "outpost_uplink_sites_connected")
		if err != nil {
			return false, nil // not serving yet
		}

		return int(n) >= online, nil
	}); err != nil {
		log.Warn("not every online site reconnected", zap.Error(err))

		r.Restart.ReconnectS = -1
	} else {
		r.Restart.ReconnectS = time.Since(started).Seconds()
	}

	// Locations: the controller's own account of what it loaded and what the edges reported.
	if err := waitFor(ctx, time.Until(deadline), 200*time.Millisecond, func() (bool, error) {
		loaded, err := findLogLines(next.logPath, "machine locations loaded from omni")
		if err != nil || len(loaded) == 0 {
			return false, nil // not written yet
		}

		r.Restart.LocationsLoaded = numberField(loaded[0], "machines")

		if r.Restart.LocationsLoaded >= cfg.Machines() {
			r.Restart.LocatedS = loaded[0].at.Sub(started).Seconds()

			return true, nil
		}

		inv, err := findLogLines(next.logPath, "edge inventory")
		if err != nil {
			return false, err
		}

		sites := map[string]time.Time{}
		for _, l := range inv {
			if s, _ := l.fields["site"].(string); s != "" {
				sites[s] = l.at
			}
		}

		if len(sites) < online {
			return false, nil
		}

		var last time.Time
		for _, at := range sites {
			if at.After(last) {
				last = at
			}
		}

		if loaded[0].at.After(last) {
			last = loaded[0].at
		}

		r.Restart.LocatedS = last.Sub(started).Seconds()

		return true, nil
	}); err != nil {
		log.Warn("the restarted controller's locations were not all known", zap.Error(err))

		r.Restart.LocatedS = -1
	}

	// Observations: with edges that watch their BMCs, every online site's watch list from the new process; else
	// the first PowerStatus each reachable machine's BMC answered the new process.
	var last time.Time

	if cfg.WatchBMCs {
		r.Restart.ObservedFrom = "the first watch list each online site's edge received from the new process"

		if err := waitFor(ctx, time.Until(deadline), 200*time.Millisecond, func() (bool, error) {
			missing := 0

			for _, s := range f.sites {
				if _, _, first := s.bmcs.watcher.listState(); !s.wan.isDown() && first.IsZero() {
					missing++
				}
			}

			r.Restart.Unobserved = missing

			return missing == 0, nil
		}); err != nil {
			log.Warn("not every online site got a watch list from the restarted controller", zap.Int("sites", r.Restart.Unobserved))
		}

		for _, s := range f.sites {
			if _, _, first := s.bmcs.watcher.listState(); first.After(last) {
				last = first
			}
		}
	} else {
		r.Restart.ObservedFrom = "the first PowerStatus each reachable machine's BMC answered the new process"

		if err := waitFor(ctx, time.Until(deadline), time.Second, func() (bool, error) {
			missing := 0

			for _, m := range watched {
				if _, first := m.bmc.statusTimes(); first.IsZero() {
					missing++
				}
			}

			r.Restart.Unobserved = missing

			return missing == 0, nil
		}); err != nil {
			log.Warn("not every reachable machine was observed by the restarted controller", zap.Int("unobserved", r.Restart.Unobserved))
		}

		for _, m := range watched {
			if _, first := m.bmc.statusTimes(); first.After(last) {
				last = first
			}
		}
	}

	if !last.IsZero() {
		r.Restart.ObservedS = last.Sub(started).Seconds()
	}

	log.Info("restart measured", zap.Float64("reconnect_s", r.Restart.ReconnectS), zap.Float64("located_s", r.Restart.LocatedS),
		zap.Int("locations_loaded", r.Restart.LocationsLoaded), zap.Float64("observed_s", r.Restart.ObservedS))

	return next, nil
}

// waitFor polls cond every interval until it holds, fails or timeout passes.
func waitFor(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)

	for {
		ok, err := cond()
		if err != nil {
			return err
		}

		if ok {
			return nil
		}

		if time.Now().After(deadline) {
			return errTimeout
		}

		if err := sleep(ctx, interval); err != nil {
			return err
		}
	}
}

// acceptor plays the operator: every machine that appears in Omni pending acceptance is accepted, its
// information collected (what a real Talos agent lets Omni do) and, for those the user keeps on, its preferred
// power state set to on.
type acceptor struct {
	f      *fleet
	admin  *omni.Admin
	wantOn map[int]bool
	byID   map[string]*machine

	mu   sync.Mutex
	done map[string]bool
}

func newAcceptor(f *fleet, admin *omni.Admin, wantOn map[int]bool) *acceptor {
	a := &acceptor{f: f, admin: admin, wantOn: wantOn, byID: map[string]*machine{}, done: map[string]bool{}}
	for _, m := range f.machines {
		a.byID[m.id] = m
	}

	return a
}

func (a *acceptor) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()

	return len(a.done)
}

func (a *acceptor) run(ctx context.Context) error {
	interval := 2 * time.Second
	if len(a.byID) > 5000 {
		interval = 5 * time.Second
	}

	for {
		if err := a.pass(ctx); err != nil && ctx.Err() == nil {
			a.f.log.Warn("accepting machines", zap.Error(err))
		}

		if a.count() == len(a.byID) || sleep(ctx, interval) != nil {
			return nil
		}
	}
}

// accept is the operator's work for one machine.
func (a *acceptor) accept(ctx context.Context, m *machine) error {
	if a.wantOn[m.index] {
		if err := a.admin.SetPowerState(ctx, m.id, "on"); err != nil {
			return err
		}
	}

	if err := a.admin.Accept(ctx, m.id); err != nil {
		return err
	}

	return a.admin.CollectInfo(ctx, m.id, "v1.11.5")
}

func (a *acceptor) pass(ctx context.Context) error {
	list, err := safe.StateListAll[*infra.Machine](ctx, a.f.admin)
	if err != nil {
		return fmt.Errorf("list infra machines: %w", err)
	}

	var todo []*machine

	a.mu.Lock()

	// Every machine in Omni not done yet, whatever its acceptance says: a step that failed (a write that raced
	// Omni's own) is taken again, the others are idempotent.
	for im := range list.All() {
		if m, ok := a.byID[im.Metadata().ID()]; ok && !a.done[m.id] {
			todo = append(todo, m)
		}
	}

	a.mu.Unlock()

	var (
		eg     errgroup.Group
		failed atomic.Int64
	)

	eg.SetLimit(16)

	for _, m := range todo {
		eg.Go(func() error {
			if err := a.accept(ctx, m); err != nil {
				if failed.Add(1) == 1 && ctx.Err() == nil {
					a.f.log.Warn("accepting a machine failed; taken again on the next pass", zap.String("machine", m.id), zap.Error(err))
				}

				return nil
			}

			a.mu.Lock()
			a.done[m.id] = true
			a.mu.Unlock()

			return nil
		})
	}

	eg.Wait() //nolint:errcheck // every error is counted above

	if len(todo) > 0 {
		a.f.log.Info("machines accepted", zap.Int("now", len(todo)), zap.Int("accepted", a.count()))
	}

	return nil
}
