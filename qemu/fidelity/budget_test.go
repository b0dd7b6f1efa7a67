package fidelity_test

import (
	"context"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	omniresources "github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/qemu/fidelity"
	"github.com/outpost-metal/outpost/qemu/omni"
)

// watchBudget is the COSI state client's retry budget per watch (cenkalti/backoff's default MaxElapsedTime):
// it is reset only when a retried watch delivers a message, so a quiet watch older than this fails at once on
// the next disconnect.
const watchBudget = 15 * time.Minute

// TestControllerOutlivesWatchBudget restarts a real Omni after the controller's watches have been quiet for
// longer than the client's retry budget. Beside the controller runs a bare runtime on one connection, as the
// first wave's controller ran: it must die there ("maximum retry attempts"), while the controller rebuilds its
// connection and carries on: heartbeats resume, a new machine is driven to ready, the machine that was ready
// before is neither wiped again nor power-cycled. It takes over 16 minutes of mostly waiting: the budget is
// the state client's default backoff, which neither the COSI adapter nor Omni's client lets a caller shorten,
// so only time brings it about. It runs beside the rest of the suite (parallel), in make test; -short skips it.
func TestControllerOutlivesWatchBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits out the client's 15-minute watch retry budget")
	}

	t.Parallel()

	b, reason := startRealOmni(t)
	if b == nil {
		t.Skip(reason)
	}

	real := b.(*fidelity.Real) // startRealOmni returns a *Real

	ctx, cancel := context.WithTimeout(t.Context(), watchBudget+10*time.Minute)
	defer cancel()

	r := &run{t: t, b: b, edge: lifecycletest.NewFakeEdge(t), tr: &transcript{}, admin: omni.NewAdmin(b.Admin()),
		jc: make(chan controlleromni.JoinConfig, 1)}
	r.startController(ctx)

	// the first wave's way: one connection, one runtime, nothing rebuilt
	conn, err := controlleromni.Connect(ctx, b.Controller(), zaptest.NewLogger(t).Named("bare-runtime"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	bare, err := conn.NewRuntime(nil, watcher{})
	require.NoError(t, err)

	bareDone := make(chan error, 1)
	bctx, bcancel := context.WithCancel(ctx)
	t.Cleanup(bcancel)

	go func() { bareDone <- bare.Run(bctx) }()

	r.edge.Add(m1, "site-a")
	_, err = fidelity.Provision(ctx, b, m1)
	require.NoError(t, err)
	r.eventually("infra machine created", func() bool { return r.machine(ctx, m1) != nil })
	require.NoError(t, r.admin.Accept(ctx, m1))
	r.eventually("ready to use", func() bool { s := r.status(ctx, m1); return s != nil && s.GetReadyToUse() })

	t.Logf("machine ready; letting the watches stay quiet past the %s retry budget", watchBudget)
	time.Sleep(watchBudget + time.Minute) // time itself is what this test needs to pass

	require.NoError(t, real.Omni().Restart(ctx))
	restarted := time.Now()

	select {
	case err := <-bareDone:
		require.ErrorContains(t, err, "maximum retry attempts", "the bare runtime dies as the first wave's controller did")
		t.Logf("bare runtime, as expected: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the bare runtime survived: the failure this test guards against did not happen")
	}

	r.eventually("heartbeats resume", func() bool {
		hs, err := safe.StateGetByID[*infra.ProviderHealthStatus](ctx, b.Admin(), b.Controller().ProviderID)

		return err == nil && hs.TypedSpec().Value.GetLastHeartbeatTimestamp().AsTime().After(restarted)
	})

	r.edge.Add(m2, "site-a")
	_, err = fidelity.Provision(ctx, b, m2)
	require.NoError(t, err)
	r.eventually("second infra machine", func() bool { return r.machine(ctx, m2) != nil })
	require.NoError(t, r.admin.Accept(ctx, m2))
	r.eventually("new machine ready after the restart", func() bool { s := r.status(ctx, m2); return s != nil && s.GetReadyToUse() })

	require.Equal(t, 1, r.edge.Count(m1, "WipeDisks"), "the machine ready before the restart is not wiped again")
	require.Zero(t, r.edge.Count(m1, "PowerCycle"), "nor power-cycled")
}

// watcher is a controller that only watches InfraMachines, so the bare runtime holds a watch as the
// lifecycle's runtime does.
type watcher struct{}

func (watcher) Name() string { return "fidelity.Watcher" }

func (watcher) Settings() controller.QSettings {
	return controller.QSettings{Inputs: []controller.Input{
		{Namespace: omniresources.InfraProviderNamespace, Type: infra.InfraMachineType, Kind: controller.InputQPrimary},
	}}
}

func (watcher) Reconcile(context.Context, *zap.Logger, controller.QRuntime, resource.Pointer) error {
	return nil
}

func (watcher) MapInput(context.Context, *zap.Logger, controller.QRuntime, controller.ReducedResourceMetadata) ([]resource.Pointer, error) {
	return nil, nil
}
