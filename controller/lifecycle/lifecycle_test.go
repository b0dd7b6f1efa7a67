package lifecycle_test

import (
	"context"
	"crypto/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/controller/runtime"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/rtestutils"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
)

const (
	providerID = "bare-metal"
	waitFor    = 15 * time.Second
	tick       = 10 * time.Millisecond
	cooldown   = time.Hour // never passes by itself: tests advance the clock
)

// sealingKey seals the BMC passwords the lifecycle stores in these tests.
var sealingKey = []byte("0123456789abcdef0123456789abcdef")

type fakeClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return time.Now().Add(c.offset)
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.offset += d
}

// harness runs the lifecycle controllers on in-memory state that the test fills as Omni would.
type harness struct {
	t *testing.T
	// configure adjusts the lifecycle configuration of this harness.
	configure []func(*lifecycle.Config)
	st        state.State
	edge      *lifecycletest.FakeEdge
	clock     *fakeClock
	types     resources.Types
	stats     *lifecycle.Metrics
	// journal gets the machines' timelines (nil: none).
	journal lifecycle.Journal
	// policies are the sites' own settings (none unless a test sets one).
	policies *machines.SitePolicies
	// inventory reads hardware inventories (nil: none are read).
	inventory lifecycle.InventoryClient

	ctrls []controller.QController
	// omniReads counts the runtime's reads that reach the state itself (not its cache): what would go to Omni.
	omniReads *readCounter

	cancel context.CancelFunc
	done   chan error
}

func newHarness(t *testing.T, configure ...func(*lifecycle.Config)) *harness {
	t.Helper()

	h := &harness{
		t:     t,
		st:    state.WrapCore(namespaced.NewState(inmem.Build)),
		edge:  lifecycletest.NewFakeEdge(t),
		clock: &fakeClock{},
		types: resources.NewTypes(providerID),
		stats: lifecycle.NewMetrics(),

		policies: machines.NewSitePolicies(),
	}

	h.configure = configure

	require.NoError(t, h.types.Register())
	h.start()
	t.Cleanup(h.stop)

	return h
}

func (h *harness) start() {
	h.t.Helper()

	cfg := lifecycle.Default()
	cfg.Cooldown = cooldown
	cfg.PollInterval = 20 * time.Millisecond
	cfg.CallTimeout = 2 * time.Second
	cfg.WipeTimeout = 5 * time.Second

	for _, c := range h.configure {
		c(&cfg)
	}

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), lifecycletest.FakeResolver{})
	require.NoError(h.t, err)

	box, err := seal.New(sealingKey, rand.Reader)
	require.NoError(h.t, err)

	h.ctrls, err = lifecycle.New(cfg, lifecycle.Deps{
		Types: h.types, Power: h.edge, Agent: h.edge, Intents: h.edge, Sites: h.edge, Plans: h.edge, Planner: planner,
		Now: h.clock.Now, Rand: rand.Reader, Metrics: h.stats, Secrets: box, Journal: h.journal, SitePolicies: h.policies,
		Inventory: h.inventory, SecureBoot: h.edge, Reach: h.edge,
	})
	require.NoError(h.t, err)

	h.run()
}

// rebuild stops the runtime and runs a new one with the same controllers, as the controller does when its
// Omni connection is rebuilt (the process and its in-memory state stay).
func (h *harness) rebuild() {
	h.t.Helper()
	h.stop()
	h.run()
}

func (h *harness) run() {
	h.t.Helper()

	// reads come from the watch-fed cache, as against Omni
	if h.omniReads == nil {
		h.omniReads = &readCounter{}
	}

	rt, err := runtime.NewRuntime(countReads(h.st, h.omniReads), zaptest.NewLogger(h.t), omni.CachedInputs(h.ctrls...)...)
	require.NoError(h.t, err)

	for _, c := range h.ctrls {
		require.NoError(h.t, rt.RegisterQController(c))
	}

	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)

	go func() { h.done <- rt.Run(ctx) }()
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}

	h.cancel()
	require.NoError(h.t, <-h.done)
	h.cancel = nil
}

// omni plays Omni: it writes the InfraMachine.
func (h *harness) omni(id string, fn func(*omnispecs.InfraMachineSpec)) {
	h.t.Helper()

	err := safe.StateModify(h.t.Context(), h.st, infra.NewMachine(id), func(m *infra.Machine) error {
		m.Metadata().Labels().Set(omnires.LabelInfraProviderID, providerID)
		fn(m.TypedSpec().Value)

		return nil
	})
	require.NoError(h.t, err)
}

func (h *harness) status(id string) *omnispecs.InfraMachineStatusSpec {
	st, err := safe.StateGetByID[*infra.MachineStatus](context.Background(), h.st, id)
	if err != nil {
		return nil
	}

	return st.TypedSpec().Value
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	require.Eventually(h.t, cond, waitFor, tick, what)
}

// statusIs waits, watching Omni's state, until the machine's InfraMachineStatus passes check.
func (h *harness) statusIs(id string, check func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions)) {
	h.t.Helper()

	ctx, cancel := context.WithTimeout(h.t.Context(), waitFor)
	defer cancel()

	rtestutils.AssertResource(ctx, h.t, h.st, id, func(st *infra.MachineStatus, a *assert.Assertions) {
		check(st.TypedSpec().Value, a)
	})
}

// never asserts cond stays false for a while (used for "nothing happens").
func (h *harness) never(what string, cond func() bool) {
	h.t.Helper()
	require.Never(h.t, cond, 300*time.Millisecond, tick, what)
}

func accepted(s *omnispecs.InfraMachineSpec) {
	s.AcceptanceStatus = omnispecs.InfraMachineConfigSpec_ACCEPTED
	s.NodeUniqueToken = "node-token"
}

// ready takes a fresh machine through accept -> BMC -> wipe -> ready -> powered off.
func (h *harness) ready(id, site string) {
	h.t.Helper()

	h.edge.Add(id, site)
	h.omni(id, accepted)

	h.statusIs(id, func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
	h.clock.Advance(2 * cooldown)
	h.eventually("powered off after cooldown", func() bool { return !h.edge.Machine(id).Power })
	h.statusIs(id, func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal(omnispecs.InfraMachineStatusSpec_POWER_STATE_OFF, s.PowerState, "power state reported off")
	})
}

// installed takes a ready machine through allocate -> install -> disk.
func (h *harness) installed(id, site string) {
	h.t.Helper()

	h.ready(id, site)
	h.omni(id, func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.eventually("booted the installer", func() bool { return h.edge.Machine(id).Booted == "install" })
	h.edge.InstallToDisk(id)
	h.omni(id, func(s *omnispecs.InfraMachineSpec) { s.InstallEventId++ })
	h.statusIs(id, func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.True(s.Installed, "installed reported")
	})
	h.eventually("disk plan acknowledged", func() bool { return h.edge.Machine(id).Acked.Mode == bootplans.ModeDisk })
}

func TestAcceptToReadyThenPowerOff(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.NodeUniqueToken = "node-token" }) // pending
	h.eventually("pending machine gets the agent plan", func() bool { return h.edge.Machine("m1").Acked.Mode == bootplans.ModeAgent })
	h.never("pending machine is not touched", func() bool {
		return h.edge.Count("m1", "GetPowerManagement")+h.edge.Count("m1", "WipeDisks")+h.edge.Count("m1", "Power") > 0
	})

	h.omni("m1", accepted)
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })

	m := h.edge.Machine("m1")
	require.Equal(t, "outpost", m.IPMIUser)
	require.Len(t, m.IPMIPass, 16)
	require.Equal(t, []string{"SetPowerManagement outpost"}, h.edge.Calls("m1", "SetPowerManagement"))

	// what Omni holds (readable by any Omni Reader) is sealed; the BMC got the password itself
	stored, err := safe.StateGet[*resources.BMCConfiguration](t.Context(), h.st, h.types.NewBMCConfiguration("m1").Metadata())
	require.NoError(t, err)
	require.True(t, seal.Sealed(stored.TypedSpec().Value.GetIpmi().GetPassword()))
	require.NotContains(t, stored.TypedSpec().Value.GetIpmi().GetPassword(), m.IPMIPass)
	require.Equal(t, 1, h.edge.Count("m1", "WipeDisks"))
	require.Equal(t, "node-token", h.status("m1").WipedNodeUniqueToken)

	h.never("not powered off before the cooldown", func() bool { return h.edge.Count("m1", "PowerOff") > 0 })
	h.clock.Advance(2 * cooldown)
	h.eventually("powered off after the cooldown", func() bool { return !h.edge.Machine("m1").Power })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal(omnispecs.InfraMachineStatusSpec_POWER_STATE_OFF, s.PowerState, "off reported")
	})
	h.never("no further power actions", func() bool { return h.edge.Count("m1", "Power") > 1 })
}

func TestAllocateInstallsThenBootsFromDisk(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) {
		s.ClusterTalosVersion = "v1.11.0"
		s.Extensions = []string{"siderolabs/iscsi-tools"}
	})
	h.eventually("powered on into the installer", func() bool { return h.edge.Machine("m1").Booted == "install" })
	require.Equal(t, []string{"PowerOn acked=install pxe=true"}, h.edge.Calls("m1", "PowerOn"),
		"one-time PXE set and the install plan acknowledged before power-on")

	h.edge.InstallToDisk("m1")
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.InstallEventId = 1 })
	h.eventually("disk plan", func() bool { return h.edge.Machine("m1").Acked.Mode == bootplans.ModeDisk })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.True(s.Installed, "installed reported")
	})

	h.clock.Advance(2 * cooldown)
	h.never("no further reboots or power changes", func() bool {
		return h.edge.Count("m1", "PowerCycle")+h.edge.Count("m1", "PowerOff") > 1 || h.edge.Count("m1", "PowerOn") > 1
	})
	require.True(t, h.edge.Machine("m1").Power)
}

func TestReleaseRebootsToAgentWipesAndPowersOff(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.installed("m1", "site-a")
	h.clock.Advance(2 * cooldown)

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) {
		s.ClusterTalosVersion = ""
		s.WipeId = "wipe-2"
		s.NodeUniqueToken = "node-token-2"
	})
	h.eventually("rebooted into agent mode", func() bool {
		return len(h.edge.Calls("m1", "PowerCycle acked=agent pxe=true")) == 1
	})
	h.eventually("wiped again", func() bool { return h.edge.Count("m1", "WipeDisks") == 2 })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal("node-token-2", s.WipedNodeUniqueToken, "wiped token reported")
		a.False(s.Installed, "installed forgotten")
		a.True(s.ReadyToUse)
	})
	h.clock.Advance(2 * cooldown)
	h.eventually("powered off", func() bool { return !h.edge.Machine("m1").Power })
}

func TestUserReboot(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.installed("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.RequestedRebootId = "reboot-1" })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal("reboot-1", s.LastRebootId, "reboot reported")
	})
	require.Equal(t, []string{"PowerCycle acked=disk pxe=false"}, h.edge.Calls("m1", "PowerCycle"))
	h.never("rebooted once", func() bool { return h.edge.Count("m1", "PowerCycle") > 1 })
}

func TestPowerOffRequestHonouredAndNeverUndone(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.installed("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PowerOffRequestId = "off-1" })
	h.eventually("powered off", func() bool { return !h.edge.Machine("m1").Power })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal("off-1", s.LastPowerOffId, "power-off reported")
	})

	h.clock.Advance(2 * cooldown)
	h.never("not powered on again although allocated", func() bool { return h.edge.Count("m1", "PowerOn") > 1 })
}

func TestPreferredPowerOn(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
	h.eventually("powered on", func() bool { return h.edge.Machine("m1").Power })
	require.Equal(t, []string{"PowerOn acked=agent pxe=true"}, h.edge.Calls("m1", "PowerOn"))

	h.clock.Advance(2 * cooldown)
	h.never("stays on", func() bool { return !h.edge.Machine("m1").Power })
}

// TestDeadBMCAskedOncePerWish: a BMC that does not answer is asked once for what the power step wants of
// it, not at every retry, while the observation cannot reach it either (each call would hold a worker for the
// whole call timeout); a new wish gets one try at once, and the BMC answering again is acted on.
func TestDeadBMCAskedOncePerWish(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	tries := func() float64 { return h.stats.Count(lifecycle.ReasonEdgeCallFailed) }

	h.edge.SetBMCDead("m1", true)
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal(omnispecs.InfraMachineStatusSpec_POWER_STATE_UNKNOWN, s.PowerState, "power state unknown")
	})
	h.eventually("the power-on was tried", func() bool { return tries() > 0 })

	// one try under way when the observation saw the BMC go silent may still fail after this count
	before := tries()
	h.never("not asked again for the same wish", func() bool { return tries() > before+1 })
	require.Positive(t, h.stats.Count(lifecycle.ReasonBMCNotAnswering), "the looks that left it alone are counted")

	before = tries()
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PowerOffRequestId = "off-1" })
	h.eventually("a new wish gets its try", func() bool { return tries() > before })
	h.never("and one only", func() bool { return tries() > before+1 })

	h.edge.SetBMCDead("m1", false)
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal("off-1", s.LastPowerOffId, "the request is honoured once the bmc answers")
	})
	require.Empty(t, h.edge.Calls("m1", "PowerOn"))
}

func TestRejectDeniesBoot(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.AcceptanceStatus = omnispecs.InfraMachineConfigSpec_REJECTED })
	h.eventually("deny plan", func() bool { return h.edge.Machine("m1").Acked.Mode == bootplans.ModeDeny })
	h.never("nothing else", func() bool {
		return h.edge.Count("m1", "GetPowerManagement")+h.edge.Count("m1", "WipeDisks")+h.edge.Count("m1", "Power") > 0
	})
}

func TestCordonTouchesNothing(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) {
		accepted(s)
		s.Cordoned = true
	})
	h.never("no call at all", func() bool { return len(h.edge.Log()) > 0 })
}

func TestDeletionRemovesOwnResources(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.installed("m1", "site-a")

	ctx := t.Context()
	_, err := h.st.Teardown(ctx, infra.NewMachine("m1").Metadata())
	require.NoError(t, err)

	h.eventually("finalizers released", func() bool {
		m, err := h.st.Get(ctx, infra.NewMachine("m1").Metadata())

		return err == nil && m.Metadata().Finalizers().Empty()
	})
	require.NoError(t, h.st.Destroy(ctx, infra.NewMachine("m1").Metadata()))

	for _, typ := range h.types.All() {
		list, err := h.st.List(ctx, resource.NewMetadata(h.types.Namespace, typ, "", resource.VersionUndefined))
		require.NoError(t, err)
		require.Empty(t, list.Items, typ)
	}

	_, err = h.st.Get(ctx, infra.NewMachineStatus("m1").Metadata())
	require.True(t, state.IsNotFoundError(err))
	require.Equal(t, bootplans.ModeAgent, h.edge.Machine("m1").Acked.Mode, "left in agent mode")
}

func TestSiteOfflineWaitsAndCompletesOnce(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	h.edge.SetOffline("site-a", true)
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.never("nothing while offline", func() bool { return h.edge.Count("m1", "PowerOn") > 0 })

	h.eventually("offline waits are counted", func() bool { return h.stats.Count(lifecycle.ReasonSiteOffline) > 0 })

	h.edge.SetOffline("site-a", false)
	h.eventually("powered on after reconnection", func() bool { return h.edge.Count("m1", "PowerOn") == 1 })
	h.never("exactly once", func() bool { return h.edge.Count("m1", "PowerOn") > 1 })
}

func TestSiteDropsMidOperation(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	h.edge.DropAfterNextAck("site-a")
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.eventually("install plan acknowledged, then the link broke", func() bool { return h.edge.Count("m1", "Ack install") == 1 })
	h.never("no power-on while offline", func() bool { return h.edge.Count("m1", "PowerOn") > 0 })

	h.edge.SetOffline("site-a", false)
	h.eventually("completed after reconnection", func() bool { return h.edge.Machine("m1").Booted == "install" })
	h.never("exactly once, plan not re-sent", func() bool {
		return h.edge.Count("m1", "PowerOn") != 1 || h.edge.Count("m1", "Ack install") != 1
	})
}

func TestPowerOnWaitsForPlanAck(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	release := make(chan struct{})

	h.edge.HoldAcks(release)

	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.eventually("install plan pushed", func() bool { return h.edge.Count("m1", "Push install") > 0 })
	h.never("no power-on before the ack", func() bool { return h.edge.Count("m1", "PowerOn") > 0 })

	close(release)
	h.eventually("powered on after the ack", func() bool { return h.edge.Count("m1", "PowerOn") == 1 })
	require.Equal(t, []string{"PowerOn acked=install pxe=true"}, h.edge.Calls("m1", "PowerOn"))
}

// TestNoRebootOnStateReadBeforeWaiting: a reboot decided on a running machine waits for the edge's
// acknowledgement of the plan; meanwhile the machine goes off. The reboot must not be carried out on what
// was read before the wait: the machine is powered on into its plan instead, once.
func TestNoRebootOnStateReadBeforeWaiting(t *testing.T) {
	t.Parallel()

	// Waits for the edge's acknowledgement last as long as the test holds them (a timed-out wait would
	// re-decide on fresh state by itself and hide the bug).
	h := newHarness(t, func(cfg *lifecycle.Config) { cfg.CallTimeout = time.Minute })
	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)
	h.eventually("ready to use, still on", func() bool { s := h.status("m1"); return s != nil && s.ReadyToUse && h.edge.Machine("m1").Power })

	release := make(chan struct{})

	h.edge.HoldAcks(release)

	// Allocated while its agent runs: the wrong mode. The boot plan controller pushes the install plan
	// (held); once the cooldown since the wipe has passed, the reboot controller decides to reboot into the
	// installer and waits for the edge too.
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.eventually("install plan pushed, not yet acknowledged", func() bool { return h.edge.Count("m1", "Push install") == 1 })
	h.clock.Advance(2 * cooldown)
	h.eventually("the reboot waits for the edge", func() bool { return h.edge.Count("m1", "Push install") == 2 })

	h.edge.PullPlug("m1")
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.Equal(omnispecs.InfraMachineStatusSpec_POWER_STATE_OFF, s.PowerState, "off reported")
	})

	close(release)
	h.eventually("powered on into the installer", func() bool { return h.edge.Machine("m1").Booted == "install" })
	h.never("no reboot, one power-on", func() bool {
		return h.edge.Count("m1", "PowerCycle") > 0 || h.edge.Count("m1", "PowerOn") != 1
	})
}

func TestRestartResumesWithoutRewipe(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.installed("m1", "site-a")

	h.stop()
	h.start()

	h.clock.Advance(2 * cooldown)
	h.never("no second wipe, no reboot after restart", func() bool {
		return h.edge.Count("m1", "WipeDisks") > 1 || h.edge.Count("m1", "PowerCycle") > 0 || h.edge.Count("m1", "PowerOff") > 1
	})
	require.True(t, h.status("m1").Installed)
}

// Omni goes away in the middle of a wipe: the runtime is rebuilt on a new connection while the agent is still
// wiping. The wipe finishes once, is recorded by the new runtime, and is not started again.
func TestOmniLostMidWipeWipesOnce(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	release := make(chan struct{})
	h.edge.HoldWipes(release)

	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)
	h.eventually("wipe in flight", func() bool { return h.edge.Count("m1", "WipeDisks") == 1 })

	h.rebuild()
	close(release)

	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
	require.Equal(t, "node-token", h.status("m1").WipedNodeUniqueToken)
	h.never("the wipe is not repeated", func() bool { return h.edge.Count("m1", "WipeDisks") > 1 })
}

func TestMachineNoEdgeHasSeenWaits(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.omni("ghost", accepted)

	h.eventually("waiting reason recorded", func() bool {
		o, err := safe.StateGet[*resources.MachineObservation](t.Context(), h.st, h.types.NewMachineObservation("ghost").Metadata())

		return err == nil && o.TypedSpec().Value.WaitingReason == "no edge has reported this machine yet"
	})

	require.Positive(t, h.stats.Count(lifecycle.ReasonMachineNotLocated))

	// it shows up later and proceeds
	h.edge.Add("ghost", "site-b")
	h.statusIs("ghost", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.True(s.ReadyToUse, "ready once seen")
	})
}

func TestNonsenseBMCConfigLeavesMachineAlone(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	bmc := infra.NewBMCConfig("m1")
	bmc.TypedSpec().Value.Config = &omnispecs.InfraMachineBMCConfigSpec{Ipmi: &omnispecs.InfraMachineBMCConfigSpec_IPMI{
		Address: "not an address!", Port: 70000,
	}}
	require.NoError(t, h.st.Create(t.Context(), bmc))

	h.omni("m1", accepted)
	h.never("no BMC, no wipe, no power", func() bool {
		return h.edge.Count("m1", "WipeDisks")+h.edge.Count("m1", "Power")+h.edge.Count("m1", "SetPowerManagement") > 0
	})
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.False(s.ReadyToUse, "reported not ready")
	})
	h.eventually("nonsense counted", func() bool { return h.stats.Count(lifecycle.ReasonInvalidBMCConfig) > 0 })
}

// Omni's BMC config is used as given (no IPMI user made through the agent), stored with its password sealed
// and written once: a sealed value differs at every write, so an unchanged config must not be rewritten.
func TestOmniBMCConfigSealedAndStable(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	bmc := infra.NewBMCConfig("m1")
	bmc.TypedSpec().Value.Config = &omnispecs.InfraMachineBMCConfigSpec{Ipmi: &omnispecs.InfraMachineBMCConfigSpec_IPMI{
		Address: "10.0.0.9", Port: 623, Username: "operator", Password: "p",
	}}
	require.NoError(t, h.st.Create(t.Context(), bmc))

	h.omni("m1", accepted)
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
	require.Zero(t, h.edge.Count("m1", "SetPowerManagement"))

	get := func() *resources.BMCConfiguration {
		r, err := safe.StateGet[*resources.BMCConfiguration](t.Context(), h.st, h.types.NewBMCConfiguration("m1").Metadata())
		require.NoError(t, err)

		return r
	}

	first := get()
	require.True(t, seal.Sealed(first.TypedSpec().Value.GetIpmi().GetPassword()))
	h.never("rewritten", func() bool { return !get().Metadata().Version().Equal(first.Metadata().Version()) })
}

func TestOtherProvidersMachinesIgnored(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")

	m := infra.NewMachine("m1")
	m.Metadata().Labels().Set(omnires.LabelInfraProviderID, "someone-else")
	accepted(m.TypedSpec().Value)
	require.NoError(t, h.st.Create(t.Context(), m))

	h.never("nothing done for another provider's machine", func() bool {
		cur, err := h.st.Get(t.Context(), m.Metadata())

		return len(h.edge.Log()) > 0 || err != nil || !cur.Metadata().Finalizers().Empty() || h.status("m1") != nil
	})
}

// Every machine's InfraMachineStatus carries its site and the provider's static labels (Omni copies them to
// its MachineStatus, where MachineClass selectors see them); a label no longer wanted goes.
func TestStatusLabels(t *testing.T) {
	t.Parallel()

	h := newHarness(t, func(c *lifecycle.Config) { c.StaticLabels = map[string]string{"tier": "gold"} })
	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	labelsOf := func() map[string]string {
		st, err := safe.StateGetByID[*infra.MachineStatus](t.Context(), h.st, "m1")
		if err != nil {
			return nil
		}

		return st.Metadata().Labels().Raw()
	}

	h.eventually("site and static labels", func() bool {
		l := labelsOf()

		return l["site"] == "site-a" && l["tier"] == "gold" && l[omnires.LabelInfraProviderID] == providerID
	})

	// An identity alert (another host asked for the machine's tunnel) is a label while it lasts.
	h.edge.SetAlert("m1", machines.AlertSecondTunnel)
	h.eventually("the alert label", func() bool { return labelsOf()[labels.Alert] == machines.AlertSecondTunnel })

	h.edge.SetAlert("m1", "")
	h.eventually("the alert label gone", func() bool {
		_, set := labelsOf()[labels.Alert]

		return !set && labelsOf()["site"] == "site-a"
	})
}

// With the zeroes method the agent overwrites every byte, under its own (long) timeout; a wipe that outlives
// it is an error and is tried again, not counted done.
func TestZeroesWipe(t *testing.T) {
	t.Parallel()

	h := newHarness(t, func(c *lifecycle.Config) {
		c.WipeMethod = "zeroes"
		c.ZeroesWipeTimeout = 200 * time.Millisecond
	})

	release := make(chan struct{})
	h.edge.HoldWipes(release)
	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	h.eventually("a wipe outlived its timeout and was tried again", func() bool { return h.edge.Count("m1", "WipeDisks zeroes") >= 2 })
	require.False(t, h.status("m1").GetReadyToUse(), "not ready while no wipe finished")

	h.edge.HoldWipes(nil)
	close(release)
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.True(s.ReadyToUse, "ready once a zeroes wipe finished")
	})
	for _, c := range h.edge.Calls("m1", "WipeDisks") {
		require.Equal(t, "WipeDisks zeroes", c, "every wipe was a zeroes wipe")
	}
}

// A site's own wipe method (controller site set) comes before the controller's: site-a zeroes its machines'
// disks, site-b keeps the controller's fast wipe.
func TestSiteWipeMethod(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	require.NoError(t, h.policies.Set("site-a", machines.SitePolicy{WipeMethod: "zeroes"}))

	h.edge.Add("m1", "site-a")
	h.edge.Add("m2", "site-b")
	h.omni("m1", accepted)
	h.omni("m2", accepted)

	for _, id := range []string{"m1", "m2"} {
		h.statusIs(id, func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready") })
	}

	require.Equal(t, []string{"WipeDisks zeroes"}, slices.Compact(h.edge.Calls("m1", "WipeDisks")), "site-a's own method")
	require.Equal(t, []string{"WipeDisks"}, slices.Compact(h.edge.Calls("m2", "WipeDisks")), "the controller's method")
}

// Two machines answering to one UUID (a contested tunnel): the accepted machine gets no agent call (no BMC
// provisioning, no wipe) until an operator clears the alert; then it goes ahead.
func TestContestedMachineHeldUntilCleared(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.edge.Add("m1", "site-a")
	h.edge.SetAlert("m1", machines.AlertTunnelContested)
	h.omni("m1", accepted)

	h.never("no agent call while the UUID is contested", func() bool {
		return h.edge.Count("m1", "WipeDisks") > 0 || h.edge.Count("m1", "SetPowerManagement") > 0
	})

	h.edge.SetAlert("m1", "")
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
		a.True(s.ReadyToUse, "ready once cleared")
	})
	require.Positive(t, h.edge.Count("m1", "WipeDisks"), "wiped before ready")
}
