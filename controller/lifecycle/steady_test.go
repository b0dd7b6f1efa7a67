package lifecycle_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/resources"
)

// readCounter counts the reads a runtime makes of its state past the cache (a modify's read before it
// writes, an uncached get): against Omni each is a signed round trip. machineWrites counts the runtime's writes
// of InfraMachines (the lifecycle only adds and removes its finalizers there; each write wakes every lifecycle
// controller).
type readCounter struct{ n, machineWrites atomic.Int64 }

// readCountingState is a state whose Gets and Lists outside the lifecycle's local namespace are counted.
type readCountingState struct {
	state.State

	reads *readCounter
}

func countReads(st state.State, c *readCounter) state.State {
	return readCountingState{State: st, reads: c}
}

func (s readCountingState) Get(ctx context.Context, ptr resource.Pointer, opts ...state.GetOption) (resource.Resource, error) {
	if ptr.Namespace() != lifecycle.LocalNamespace {
		s.reads.n.Add(1)
	}

	return s.State.Get(ctx, ptr, opts...)
}

func (s readCountingState) Update(ctx context.Context, res resource.Resource, opts ...state.UpdateOption) error {
	err := s.State.Update(ctx, res, opts...)

	// Counted when written: an update refused for a stale version (two controllers adding the finalizers at
	// once, the second then finds them there) writes nothing and wakes nobody.
	if err == nil && res.Metadata().Type() == infra.InfraMachineType {
		s.reads.machineWrites.Add(1)
	}

	return err
}

func (s readCountingState) List(ctx context.Context, kind resource.Kind, opts ...state.ListOption) (resource.List, error) {
	if kind.Namespace() != lifecycle.LocalNamespace {
		s.reads.n.Add(1)
	}

	return s.State.List(ctx, kind, opts...)
}

// A machine whose state does not change costs Omni nothing while the lifecycle keeps looking at it: its
// observation (made every poll interval) and its InfraMachineStatus (looked at every two) are compared with
// what is there, not written, and so not read from Omni either. Before, every poll read both from Omni.
func TestSteadyMachineCostsOmniNothing(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	// the observation's own poll is the clock: it asks the (unwatched) BMC every poll interval
	polls := func() int { return h.edge.StatusReads("m1") }
	waitPolls := func(n int) {
		from := polls()
		h.eventually("the observation polls on", func() bool { return polls() >= from+n })
	}

	obs := func() *resources.MachineObservation {
		o, err := safe.StateGet[*resources.MachineObservation](t.Context(), h.st, h.types.NewMachineObservation("m1").Metadata())
		require.NoError(t, err)

		return o
	}

	status := func() *infra.MachineStatus {
		s, err := safe.StateGetByID[*infra.MachineStatus](t.Context(), h.st, "m1")
		require.NoError(t, err)

		return s
	}

	require.True(t, obs().TypedSpec().Value.GetObservedAt().IsValid(), "observed_at is set when an observation is written")

	// the last writes of the way to ready land within a few polls
	deadline := time.Now().Add(waitFor)

	for {
		before := h.omniReads.n.Load()

		waitPolls(5)

		if h.omniReads.n.Load() == before {
			break
		}

		require.True(t, time.Now().Before(deadline), "five polls in a row that read nothing from omni")
	}

	reads, obsVersion, statusVersion := h.omniReads.n.Load(), obs().Metadata().Version().Value(), status().Metadata().Version().Value()
	observedAt := obs().TypedSpec().Value.GetObservedAt().AsTime()

	waitPolls(10)

	require.Equal(t, reads, h.omniReads.n.Load(), "ten polls of a steady machine read nothing from omni")
	require.Equal(t, obsVersion, obs().Metadata().Version().Value(), "an unchanged observation is not written")
	require.Equal(t, statusVersion, status().Metadata().Version().Value(), "an unchanged InfraMachineStatus is not written")
	require.Equal(t, observedAt, obs().TypedSpec().Value.GetObservedAt().AsTime())

	// a change is observed and written, with a new observed_at
	h.edge.SetOffline("site-a", true)
	h.eventually("the change is written", func() bool { return obs().Metadata().Version().Value() != obsVersion })
	require.False(t, obs().TypedSpec().Value.GetObservedAt().AsTime().Before(observedAt))
}
