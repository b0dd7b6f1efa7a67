package lifecycle_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/resources"
)

// The observation, which waits on an edge call for every machine, has more workers than the other steps, so
// slow edges do not keep every other machine from being observed.
func TestObservationConcurrency(t *testing.T) {
	t.Parallel()

	edge := lifecycletest.NewFakeEdge()

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), lifecycletest.FakeResolver{}, edge)
	require.NoError(t, err)

	workers := func(cfg lifecycle.Config) map[string]uint {
		ctrls, err := lifecycle.New(cfg, lifecycle.Deps{
			Types: resources.NewTypes(providerID), Power: edge, Agent: edge, Sites: edge, Plans: edge, Planner: planner,
			Now: time.Now, Rand: rand.Reader,
		})
		require.NoError(t, err)

		out := map[string]uint{}
		for _, c := range ctrls {
			out[c.Name()] = c.Settings().Concurrency.ValueOr(1)
		}

		return out
	}

	def := workers(lifecycle.Default())
	require.Equal(t, uint(64), def["lifecycle.MachineObservationController"])
	require.Equal(t, uint(8), def["lifecycle.PowerController"])

	cfg := lifecycle.Default()
	cfg.ObservationConcurrency = 16
	cfg.Concurrency = 32
	set := workers(cfg)
	require.Equal(t, uint(32), set["lifecycle.MachineObservationController"], "never fewer than the other steps")
	require.Equal(t, uint(32), set["lifecycle.WipeController"])
}
