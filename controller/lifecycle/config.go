// Package lifecycle holds the controller's machine lifecycle as COSI QControllers on Omni's state, one per file:
// machine observation (power via BMC, agent reachability), BMC configuration, wipe, power, reboot, boot plans,
// hardware inventory (read from the BMC, published as labels), InfraMachineStatus and teardown, with the
// semantics Omni expects from a static infra provider.
// Edge access goes through the small interfaces of edge.go; what the edges tell of machines (their sites,
// boot details, watched power) and the clients that reach them are package machines, which never imports this one.
package lifecycle

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
)

// Config tunes the lifecycle.
type Config struct {
	// Cooldown is the minimum time between a power-on or reboot and the next power-off or reboot decided by the
	// controller (user requests aside).
	Cooldown time.Duration
	// PollInterval is how often a machine's power state and agent presence are refreshed.
	PollInterval time.Duration
	// WipeMethod is how disks are wiped: "fast" (the agent drops partition tables and signatures) or "zeroes"
	// (every byte overwritten: bounded by WipeTimeout, which must fit the largest disks).
	WipeMethod machines.WipeMethod
	// AgentReconnectGrace is how long a machine whose agent went away is left to see it back (Talos restarts an
	// agent that exited) before it is rebooted into agent mode.
	AgentReconnectGrace time.Duration
	// WipeTimeout bounds one fast disk wipe.
	WipeTimeout time.Duration
	// ZeroesWipeTimeout bounds one zeroes wipe (hours: a 10 TB spinning disk at 200 MB/s takes 14 h).
	ZeroesWipeTimeout time.Duration
	// CallTimeout bounds every other edge call, and the wait for an edge to acknowledge a boot plan.
	CallTimeout time.Duration
	// IPMIUsername is the IPMI user the controller creates through the agent.
	IPMIUsername string
	// Concurrency is how many machines each controller handles at once.
	Concurrency uint
	// EdgeCallConcurrency is how many machines each step that waits on calls through the machine's edge
	// handles at once: the observation (the agent's Hello), the BMC configuration, the wipe and the power step;
	// 0: 64, and never fewer than Concurrency. With few workers, slow edges make every other machine wait: in
	// the fleet simulator 2,000 machines were ready 96 s after start with 64, 315 s with 8, and at 20,000 a
	// power-on request waited 46 s (p50) behind the power step's calls to dead BMCs with 8. Reboot keeps
	// Concurrency: it acts only on machines whose BMC answers.
	EdgeCallConcurrency uint
	// StaticLabels are published on every machine's InfraMachineStatus (validated with package labels).
	StaticLabels map[string]string
	// InventoryInterval is how long a machine's hardware inventory is kept before its BMC is asked again
	// (default and 0: a day); a new BMC configuration is asked at once, a failed read again after a 24th of it.
	InventoryInterval time.Duration
}

// Default returns the lifecycle defaults.
func Default() Config {
	return Config{
		Cooldown:            5 * time.Minute,
		PollInterval:        30 * time.Second,
		WipeMethod:          machines.WipeFast,
		WipeTimeout:         time.Hour,
		AgentReconnectGrace: 30 * time.Second,
		ZeroesWipeTimeout:   24 * time.Hour,
		CallTimeout:         time.Minute,
		IPMIUsername:        "outpost",
		Concurrency:         8,
		InventoryInterval:   defaultInventoryInterval,
	}
}

// Validate reports settings that cannot work.
func (c Config) Validate() error {
	switch {
	case c.PollInterval <= 0:
		return errors.New("poll interval must be positive")
	case c.WipeMethod != machines.WipeFast && c.WipeMethod != machines.WipeZeroes:
		_, err := machines.ParseWipeMethod(string(c.WipeMethod))

		return err
	case c.WipeTimeout <= 0 || c.ZeroesWipeTimeout <= 0 || c.CallTimeout <= 0:
		return errors.New("timeouts must be positive")
	case c.AgentReconnectGrace < 0:
		return errors.New("agent reconnect grace must not be negative")
	case c.Cooldown < 0:
		return errors.New("cooldown must not be negative")
	case c.IPMIUsername == "" || len(c.IPMIUsername) > 16:
		return errors.New("ipmi username must have 1 to 16 characters")
	case c.Concurrency == 0:
		return errors.New("concurrency must be positive")
	case c.InventoryInterval < 0:
		return errors.New("inventory interval must not be negative")
	}

	return nil
}

// Deps are the lifecycle's collaborators.
type Deps struct {
	Types   resources.Types
	Power   PowerClient
	Agent   AgentClient
	Intents IntentClient
	Sites   SiteLocator
	Plans   PlanPusher
	Planner Planner
	// Now is the clock; Rand is the source of generated BMC passwords.
	Now  func() time.Time
	Rand io.Reader
	// Metrics counts problems (optional: unregistered metrics when nil).
	Metrics *Metrics
	// Secrets seals BMC passwords written to Omni (optional: stored in the clear when nil, for tests).
	Secrets Secrets
	// SiteLabels gives the labels an operator set on a site (optional).
	SiteLabels SiteLabels
	// SitePolicies are the sites' own BMC protocol, wipe method and Secure Boot (optional: the controller's for
	// all).
	SitePolicies *machines.SitePolicies
	// Watches tells each site's edge which BMCs to watch (optional: without it the controller asks the BMCs).
	Watches *machines.WatchLists
	// Journal records what happens to each machine for operators (optional).
	Journal Journal
	// Inventory reads machines' hardware inventories from their BMCs (optional: Power when it can, else no
	// inventory labels).
	Inventory InventoryClient
	// Reach says how each site's machines reach its edge (the boot tables, from the edges' acknowledgements),
	// which a signed image's locked command line must name (optional: no machine gets a signed image of its
	// own, and the edge's own signed file is what Secure Boot machines boot).
	Reach SiteReach
	// SecureBoot takes what each inventory read says of the machine's Secure Boot, for its boot plans
	// (optional: the plans then say only what operators set).
	SecureBoot SecureBootReports
}

// SiteLabels tells the labels an operator set on a site, published on its machines.
type SiteLabels interface {
	SiteLabels(siteID string) map[string]string
}

func (d Deps) validate() error {
	if d.Power == nil || d.Agent == nil || d.Intents == nil || d.Sites == nil || d.Plans == nil || d.Planner == nil || d.Now == nil || d.Rand == nil {
		return errors.New("a lifecycle dependency is missing")
	}

	if d.Types.ProviderID == "" {
		return errors.New("resource types have no provider ID")
	}

	return nil
}

// New returns all lifecycle controllers, to register with the runtime on Omni's state.
func New(cfg Config, deps Deps) ([]controller.QController, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lifecycle config: %w", err)
	}

	if err := deps.validate(); err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}

	if deps.Metrics == nil {
		deps.Metrics = NewMetrics()
	}

	if ic, ok := deps.Power.(InventoryClient); ok && deps.Inventory == nil {
		deps.Inventory = ic
	}

	deps.Power = timedPower{next: deps.Power, m: deps.Metrics}
	deps.Agent = timedAgent{next: deps.Agent, m: deps.Metrics}

	env := &env{
		cfg: cfg, types: deps.Types, metrics: deps.Metrics, journal: deps.Journal, secrets: deps.Secrets, gate: newPlanGate(deps.Sites, deps.SitePolicies, deps.Reach, deps.Planner, deps.Plans, cfg.CallTimeout), outbox: newOutbox(), jobs: newJobs(), written: newWritten(),
		due: newDues(time.Now), failing: newFailingSet(time.Now),
	}

	env.intents = &intentBook{client: deps.Intents, rand: deps.Rand, now: deps.Now, callTimeout: cfg.CallTimeout, journal: deps.Journal}
	env.boot = &booter{
		gate: env.gate, power: deps.Power, policies: deps.SitePolicies, journal: deps.Journal, metrics: deps.Metrics,
		callTimeout: cfg.CallTimeout, pollInterval: cfg.PollInterval,
	}

	// a machine whose location, agent tunnel or watched power changes is observed again at once
	if n, ok := deps.Sites.(changeNotifier); ok {
		n.OnChange(func(machineID string) { env.due.after(observationName, machineID, 0) })
	}

	qcs := []controller.QController{
		newMachineObservationController(env, deps),
		newBMCConfigurationController(env, deps),
		newWipeController(env, deps),
		newBootPlanController(env, deps),
		newPowerController(env, deps),
		newRebootController(env, deps),
		newInfraMachineStatusController(env, deps),
		newTeardownController(env, deps),
	}

	if deps.Inventory != nil {
		qcs = append(qcs, newMachineInventoryController(env, deps))
	}

	for _, qc := range qcs {
		env.finalizers = append(env.finalizers, qc.Name())
	}

	return append(qcs, newScheduleController(env, qcs)), nil
}

// changeNotifier is a SiteLocator that says when what it tells of a machine changed (Locations).
type changeNotifier interface {
	OnChange(fn func(machineID string))
}

// env is what every lifecycle controller shares: the records and the schedule. A step holds the collaborators
// it uses itself (given at construction from Deps), never env.
type env struct {
	types   resources.Types
	metrics *Metrics
	// journal is told each step's errors (optional: nil); secrets opens the stored BMC passwords (optional).
	journal Journal
	secrets Secrets

	cfg  Config
	gate *planGate
	// intents opens intents and settles them with the edges (the wipe and reboot steps).
	intents *intentBook
	// boot boots machines into their plans (the power and reboot steps).
	boot *booter
	// outbox and jobs outlive a runtime rebuilt on a new Omni connection: see outbox.go.
	outbox  *outbox
	jobs    *jobs
	written *written
	// due is when each controller looks at each machine again (due.go); it outlives a rebuilt runtime too.
	due *dues
	// failing is the steps whose last look at a machine failed (requeue); it outlives a rebuilt runtime too.
	failing *failingSet
	// finalizers are the machine controllers' names, each one's finalizer on the InfraMachines it acts on.
	finalizers []resource.Finalizer
}
