package omni_test

import (
	"context"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/client"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/qemu/omni"
)

// runController runs the controller's Omni side as the binary does (a Keeper that rebuilds the connection and
// the runtime whenever Omni goes away) against the stand-in, until the returned stop is called.
func runController(t *testing.T, s *standIn, edge *lifecycletest.FakeEdge) (stop func()) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), lifecycletest.FakeResolver{})
	require.NoError(t, err)

	cfg := lifecycle.Default()
	cfg.Cooldown = 300 * time.Millisecond
	cfg.PollInterval = 50 * time.Millisecond
	cfg.CallTimeout = 2 * time.Second

	ctrls, err := lifecycle.New(cfg, lifecycle.Deps{
		Types: resources.NewTypes("bare-metal"), Power: edge, Agent: edge, Intents: edge, Sites: edge, Plans: edge, Planner: planner,
		Now: time.Now, Rand: rand.Reader,
	})
	require.NoError(t, err)

	keeper, err := controlleromni.NewKeeper(connectConfig(s, s.ProviderKey()), zaptest.NewLogger(t), nil,
		func(ctx context.Context, conn *controlleromni.Connection) error {
			rt, err := conn.NewRuntime(nil, ctrls...)
			if err != nil {
				return err
			}

			return rt.Run(ctx)
		})
	require.NoError(t, err)

	done := make(chan error, 1)

	go func() { done <- keeper.Run(ctx) }()

	stopped := false
	stop = func() {
		if stopped {
			return
		}

		stopped = true

		cancel()
		require.NoError(t, <-done)
	}

	t.Cleanup(stop)

	return stop
}

func imStatus(ctx context.Context, s *standIn, id string) *omnispecs.InfraMachineStatusSpec {
	st, err := safe.StateGetByID[*infra.MachineStatus](ctx, s.State(), id)
	if err != nil {
		return nil
	}

	return st.TypedSpec().Value
}

// TestControllerAgainstStandIn runs the controller's Omni connection and lifecycle against the stand-in over
// gRPC: a machine provisions over SideroLink, is accepted, gets its BMC and a wipe, becomes ready and is powered
// off; allocated, it installs; after a controller restart nothing is wiped again.
func TestControllerAgainstStandIn(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())
	admin := omni.NewAdmin(s.client(t, s.AdminKey()))
	edge := lifecycletest.NewFakeEdge(t)

	stop := runController(t, s, edge)

	// the machine boots agent mode at site-a and its agent provisions over SideroLink
	edge.Add("m-1", "site-a")
	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	_, err = s.State().WatchFor(ctx, infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)

	require.NoError(t, admin.Accept(ctx, "m-1"))

	require.Eventually(t, func() bool {
		st := imStatus(ctx, s, "m-1")

		return st != nil && st.ReadyToUse && st.WipedNodeUniqueToken == nodeToken("m-1")
	}, 20*time.Second, 20*time.Millisecond, "ready to use")
	require.Equal(t, 1, edge.Count("m-1", "WipeDisks"))

	// Omni keeps an accepted machine on until it has collected its information (a real Talos reports in over
	// SideroLink); past the cooldown it stays on.
	require.Never(t, func() bool { return !edge.Machine("m-1").Power }, time.Second, 20*time.Millisecond,
		"kept on while Omni has not collected the machine's information")
	require.NoError(t, admin.CollectInfo(ctx, "m-1", "v1.11.0"))

	require.Eventually(t, func() bool {
		st := imStatus(ctx, s, "m-1")

		return !edge.Machine("m-1").Power && st.PowerState == omnispecs.InfraMachineStatusSpec_POWER_STATE_OFF
	}, 20*time.Second, 20*time.Millisecond, "powered off after the cooldown")

	require.NoError(t, admin.Allocate(ctx, "m-1", "c1", "1.11.5", nil, false)) // Omni's form: no v
	require.Eventually(t, func() bool { return edge.Machine("m-1").Booted == "install" }, 20*time.Second, 20*time.Millisecond)

	edge.InstallToDisk("m-1")
	require.NoError(t, admin.ReportInstalled(ctx, "m-1"))
	require.Eventually(t, func() bool { st := imStatus(ctx, s, "m-1"); return st != nil && st.Installed }, 20*time.Second, 20*time.Millisecond)

	// restart mid-lifecycle: everything is in Omni's state
	stop()
	runController(t, s, edge)

	require.Never(t, func() bool {
		return edge.Count("m-1", "WipeDisks") > 1 || edge.Count("m-1", "PowerCycle") > 0 || edge.Count("m-1", "PowerOff") > 1
	}, time.Second, 20*time.Millisecond, "no re-wipe or reboot after restart")
}

// TestControllerSurvivesOmniRestart: Omni goes away mid-run and comes back; the controller carries on
// (heartbeats resume, a new machine is driven to ready) without being restarted. In the second case Omni comes
// back unable to resume any watch (its store was compacted or restored): the COSI runtime stops on that at
// once, as it does when a quiet watch outlives the client's 15-minute retry budget, and the controller must
// rebuild its connection and runtime. The controller of the first wave exited there.
func TestControllerSurvivesOmniRestart(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name          string
		refuseResumed bool
	}{
		{name: "watches resume"},
		{name: "watches cannot resume", refuseResumed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testOmniRestart(t, tc.refuseResumed)
		})
	}
}

func testOmniRestart(t *testing.T, refuseResumed bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	cfg := omni.Default()
	cfg.StateDir = t.TempDir()

	s := startStandIn(t, cfg)
	edge := lifecycletest.NewFakeEdge(t)
	runController(t, s, edge)

	// a machine ready before the restart must not be touched again after it
	edge.Add("m-1", "site-a")
	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	_, err = s.State().WatchFor(ctx, infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)
	require.NoError(t, omni.NewAdmin(s.State()).Accept(ctx, "m-1"))
	require.Eventually(t, func() bool { st := imStatus(ctx, s, "m-1"); return st != nil && st.ReadyToUse }, 30*time.Second, 20*time.Millisecond)

	addr := s.addr
	s.stop()

	time.Sleep(300 * time.Millisecond) // Omni stays away for a while on purpose

	srv, err := omni.New(func() omni.Config {
		c := cfg
		c.Logger = zaptest.NewLogger(t)
		c.RefuseResumedWatches = refuseResumed

		return c
	}())
	require.NoError(t, err)

	t.Cleanup(func() { srv.Close() }) //nolint:errcheck

	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)

	sctx, scancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- srv.Serve(sctx, ln) }()

	t.Cleanup(func() { scancel(); <-done })

	restarted := time.Now()

	require.Eventually(t, func() bool {
		hs, err := safe.StateGetByID[*infra.ProviderHealthStatus](ctx, srv.State(), "bare-metal")

		return err == nil && hs.TypedSpec().Value.LastHeartbeatTimestamp.AsTime().After(restarted)
	}, 30*time.Second, 50*time.Millisecond, "heartbeats resume after omni comes back")

	// the lifecycle's watches resumed too: a machine joining now is driven to ready
	c, err := client.New("grpc://"+addr, client.WithServiceAccount(srv.AdminKey()))
	require.NoError(t, err)

	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	admin := omni.NewAdmin(c.Omni().State())
	token, err := admin.JoinToken(ctx, "bare-metal")
	require.NoError(t, err)

	edge.Add("m-9", "site-a")
	_, err = provisionWith(ctx, addr, "m-9", token)
	require.NoError(t, err)

	_, err = srv.State().WatchFor(ctx, infra.NewMachine("m-9").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)
	require.NoError(t, admin.Accept(ctx, "m-9"))

	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, srv.State(), "m-9")

		return err == nil && st.TypedSpec().Value.ReadyToUse
	}, 30*time.Second, 50*time.Millisecond, "machine driven to ready after omni came back")

	require.Equal(t, 1, edge.Count("m-1", "WipeDisks"), "the machine ready before the restart is not wiped again")
	require.Zero(t, edge.Count("m-1", "PowerCycle"), "nor rebooted")
}
