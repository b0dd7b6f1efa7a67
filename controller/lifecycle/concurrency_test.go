package lifecycle_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/resources"
)

// The steps that wait on calls through the edge (observation, BMC configuration, wipe, power) have more workers
// than the others, so slow edges do not keep every other machine waiting.
func TestEdgeCallConcurrency(t *testing.T) {
	t.Parallel()

	workers := func(cfg lifecycle.Config) map[string]uint {
		out := map[string]uint{}
		for _, c := range newControllers(t, cfg, resources.NewTypes(providerID)) {
			out[c.Name()] = c.Settings().Concurrency.ValueOr(1)
		}

		return out
	}

	def := workers(lifecycle.Default())
	for _, name := range []string{"MachineObservation", "BMCConfiguration", "Wipe", "Power"} {
		require.Equal(t, uint(64), def["lifecycle."+name+"Controller"], name)
	}

	for _, name := range []string{"Reboot", "InfraMachineStatus", "BootPlan"} {
		require.Equal(t, uint(8), def["lifecycle."+name+"Controller"], name)
	}

	cfg := lifecycle.Default()
	cfg.EdgeCallConcurrency = 16
	cfg.Concurrency = 32
	set := workers(cfg)
	require.Equal(t, uint(32), set["lifecycle.MachineObservationController"], "never fewer than the other steps")
	require.Equal(t, uint(32), set["lifecycle.WipeController"])
	require.Equal(t, uint(32), set["lifecycle.TeardownController"])
}

// newControllers returns the lifecycle's controllers over a fake edge, to look at how they are set up.
func newControllers(t *testing.T, cfg lifecycle.Config, types resources.Types) []controller.QController {
	t.Helper()

	edge := lifecycletest.NewFakeEdge(t)

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), lifecycletest.FakeResolver{})
	require.NoError(t, err)

	ctrls, err := lifecycle.New(cfg, lifecycle.Deps{
		Types: types, Power: edge, Agent: edge, Intents: edge, Sites: edge, Plans: edge, Planner: planner, Now: time.Now, Rand: rand.Reader,
	})
	require.NoError(t, err)

	return ctrls
}
