package fleet

import (
	"errors"
	"fmt"
	"time"
)

// Config is a fleet run: its size, the failures it carries, the simulated hardware's timing and the phases'
// bounds. Default is small enough for a few minutes on two shared cores.
type Config struct {
	// Sites and MachinesPerSite size the fleet.
	Sites           int `json:"sites"`
	MachinesPerSite int `json:"machines_per_site"`

	// ControllerBinary is the controller to run (built from ./controller); Self is this program, re-run as the
	// Omni stand-in's child process.
	ControllerBinary string `json:"controller_binary"`
	Self             string `json:"-"`
	// WorkDir holds every process's state (sites, controller, stand-in); OutDir gets the figures and logs.
	WorkDir string `json:"work_dir"`
	OutDir  string `json:"out_dir"`

	// PollInterval and Cooldown are the controller's --poll-interval and --power-cooldown.
	PollInterval time.Duration `json:"poll_interval"`
	Cooldown     time.Duration `json:"cooldown"`
	// ControllerLogLevel is the controller's --log-level; EdgeLogLevel the simulated edges' (their log is a file).
	ControllerLogLevel string `json:"controller_log_level"`
	EdgeLogLevel       string `json:"edge_log_level"`

	// OnFraction of the machines the user keeps powered on (preferred power state on: they stay in agent mode);
	// the rest are idle and powered off after the cooldown, as Omni prefers once it has their information.
	OnFraction float64 `json:"on_fraction"`
	// DeadBMCFraction of the BMCs never answer; OfflineSiteFraction of the sites lose their WAN link once the
	// fleet is ready, and stay offline for the rest of the run.
	DeadBMCFraction     float64 `json:"dead_bmc_fraction"`
	OfflineSiteFraction float64 `json:"offline_site_fraction"`
	// FlappingSites of the others lose their WAN link every FlapEvery (for half of it) from the steady state
	// until the restart; their machines are left out of the figures like an offline site's.
	FlappingSites int           `json:"flapping_sites"`
	FlapEvery     time.Duration `json:"flap_every"`
	// OmniLatency delays every call the stand-in serves (a slow Omni).
	OmniLatency time.Duration `json:"omni_latency"`
	// BMC is how the live BMCs answer.
	BMC BMCBehaviour `json:"bmc"`
	// WatchBMCs makes the edges watch their BMCs when the controller asks (edge/bmc's Watcher, as the real edge
	// does); off, the controller finds they do not and polls the BMCs itself.
	WatchBMCs bool `json:"watch_bmcs"`

	// BootDelay is a power-on's time to the first DHCP request (drawn from [BootDelay/2, 3*BootDelay/2]);
	// WipeTime a disk wipe's; InstallTime an install's.
	BootDelay   time.Duration `json:"boot_delay"`
	WipeTime    time.Duration `json:"wipe_time"`
	InstallTime time.Duration `json:"install_time"`
	// BootRate is how many machines are powered on per second when the fleet starts (a site's machines arrive
	// together, sites in turn).
	BootRate int `json:"boot_rate"`
	// AgentConns is how agents reach their edge: "machine" (each agent on its own connection from its machine's
	// own address, as real agents do, within the edge's default tunnel limits) or "site" (a site's agents on a few
	// connections from the site's address, 8 on each, with the edge's per-connection and per-source tunnel limits
	// raised to allow it: cheaper for the simulator, the same for the controller).
	AgentConns string `json:"agent_conns"`
	// ProvisionEveryBoot makes the agent call SideroLink Provision on every agent-mode boot, as Talos does;
	// off, only on the first (the stand-in's cost, not the controller's).
	ProvisionEveryBoot bool `json:"provision_every_boot"`

	// ReadyTimeout bounds the wait for every machine to be ready to use and its power to match the user's wish.
	ReadyTimeout time.Duration `json:"ready_timeout"`
	// Settle is the wait after the sites go offline and before the steady-state window; Window is that window.
	Settle time.Duration `json:"settle"`
	Window time.Duration `json:"window"`
	// IntentSamples is how many power-on and reboot requests are timed (half each), IntentSpacing the time
	// between two, IntentTimeout the wait for each to reach its BMC.
	IntentSamples int           `json:"intent_samples"`
	IntentSpacing time.Duration `json:"intent_spacing"`
	IntentTimeout time.Duration `json:"intent_timeout"`
	// RestartTimeout bounds the wait for a restarted controller's sessions and locations.
	RestartTimeout time.Duration `json:"restart_timeout"`
	// Perf records the controller with `perf record` during the window (when perf is installed).
	Perf bool `json:"perf"`
	// OpenFiles is the simulator's open-file limit (0: unknown); Validate refuses a fleet that needs more.
	OpenFiles uint64 `json:"open_files"`
	// Label is free text kept with the figures (what was measured: a commit, a change).
	Label string `json:"label"`
	// Seed chooses the dead BMCs, the offline sites and the samples.
	Seed uint64 `json:"seed"`
}

// Default returns a run of 50 sites of 40 machines with 1% dead BMCs and 5% of the sites offline.
func Default() Config {
	return Config{
		Sites:               50,
		MachinesPerSite:     40,
		WorkDir:             "",
		OutDir:              "_out/fleet",
		PollInterval:        30 * time.Second,
		Cooldown:            20 * time.Second,
		ControllerLogLevel:  "info",
		EdgeLogLevel:        "warn",
		OnFraction:          0.5,
		DeadBMCFraction:     0.01,
		OfflineSiteFraction: 0.05,
		FlapEvery:           5 * time.Second,
		BMC:                 BMCBehaviour{Latency: 30 * time.Millisecond, Jitter: 40 * time.Millisecond, FailureRate: 0.001, DeadAfter: 4 * time.Second},
		BootDelay:           2 * time.Second,
		WipeTime:            time.Second,
		InstallTime:         5 * time.Second,
		BootRate:            100,
		AgentConns:          "machine",
		WatchBMCs:           true,
		ReadyTimeout:        20 * time.Minute,
		Settle:              45 * time.Second,
		Window:              90 * time.Second,
		IntentSamples:       40,
		IntentSpacing:       250 * time.Millisecond,
		IntentTimeout:       2 * time.Minute,
		RestartTimeout:      5 * time.Minute,
		Perf:                true,
		Seed:                1,
	}
}

// Machines is the fleet's size in machines.
func (c Config) Machines() int { return c.Sites * c.MachinesPerSite }

// filesNeeded estimates the simulator's open files: per site its uplink, agent endpoint and journal, and per
// agent both ends of its connection when each has its own.
func (c Config) filesNeeded() uint64 {
	n := uint64(c.Sites) * 16 // validated sizes

	if c.AgentConns == "machine" {
		n += 2 * uint64(c.Machines()) // validated sizes
	} else {
		n += 2 * uint64(c.Sites) * uint64((c.MachinesPerSite+agentsPerConn-1)/agentsPerConn) // validated sizes
	}

	return n + 1024
}

// Validate reports a configuration the simulator cannot run.
func (c Config) Validate() error {
	var errs []error

	frac := func(name string, v float64) {
		if v < 0 || v > 1 {
			errs = append(errs, fmt.Errorf("%s %v: want 0 to 1", name, v))
		}
	}

	switch {
	case c.Sites < 1 || c.Sites > 60000:
		errs = append(errs, fmt.Errorf("sites %d: want 1 to 60000", c.Sites))
	case c.MachinesPerSite < 1 || c.Machines() > 1<<20:
		errs = append(errs, fmt.Errorf("%d machines per site: want at least 1 and at most %d in all", c.MachinesPerSite, 1<<20))
	}

	if c.AgentConns != "machine" && c.AgentConns != "site" {
		errs = append(errs, fmt.Errorf("agent connections %q: want machine or site", c.AgentConns))
	}

	frac("on fraction", c.OnFraction)
	frac("dead bmc fraction", c.DeadBMCFraction)
	frac("offline site fraction", c.OfflineSiteFraction)
	frac("bmc failure rate", c.BMC.FailureRate)

	if need := c.filesNeeded(); c.OpenFiles > 0 && need > c.OpenFiles {
		errs = append(errs, fmt.Errorf("the fleet needs about %d open files and the simulator may have %d: "+
			"use --agent-conns site (a few agent connections per site) or fewer machines", need, c.OpenFiles))
	}

	if c.ControllerBinary == "" || c.Self == "" || c.WorkDir == "" || c.OutDir == "" {
		errs = append(errs, errors.New("controller binary, self, work and out directories are required"))
	}

	if c.PollInterval <= 0 || c.Cooldown < 0 || c.BootRate <= 0 || c.Window <= 0 || c.ReadyTimeout <= 0 ||
		c.IntentTimeout <= 0 || c.RestartTimeout <= 0 || c.BMC.DeadAfter <= 0 {
		errs = append(errs, errors.New("poll interval, boot rate, window and timeouts must be positive, cooldown not negative"))
	}

	if c.FlappingSites < 0 || c.FlappingSites > c.Sites-roundCount(c.Sites, c.OfflineSiteFraction) {
		errs = append(errs, fmt.Errorf("flapping sites %d: want 0 to the sites not offline", c.FlappingSites))
	}

	if c.FlappingSites > 0 && c.FlapEvery < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("flap every %s: want at least 100ms", c.FlapEvery))
	}

	if c.IntentSamples < 0 || c.BMC.Latency < 0 || c.BMC.Jitter < 0 || c.BootDelay < 0 || c.WipeTime < 0 || c.InstallTime < 0 || c.Settle < 0 ||
		c.OmniLatency < 0 {
		errs = append(errs, errors.New("samples, latencies and delays must not be negative"))
	}

	return errors.Join(errs...)
}
