package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/lease"
	"github.com/outpost-metal/outpost/controller/resources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cuttable is a state a test can cut off from one controller, as a network partition or a stuck Omni would:
// cut, every call fails at once; hung, every call waits until its context ends (an Omni that accepts the
// connection and never answers). It remembers when the last update that went through was begun.
type cuttable struct {
	state.State
	cut, hang atomic.Bool
	lastWrite atomic.Int64 // unix nanoseconds
}

var errCut = errors.New("omni unreachable (cut by the test)")

func (c *cuttable) blocked(ctx context.Context) error {
	switch {
	case c.hang.Load():
		<-ctx.Done()

		return ctx.Err()
	case c.cut.Load():
		return errCut
	}

	return nil
}

func (c *cuttable) Get(ctx context.Context, p resource.Pointer, opts ...state.GetOption) (resource.Resource, error) {
	if err := c.blocked(ctx); err != nil {
		return nil, err
	}

	return c.State.Get(ctx, p, opts...)
}

func (c *cuttable) Create(ctx context.Context, r resource.Resource, opts ...state.CreateOption) error {
	if err := c.blocked(ctx); err != nil {
		return err
	}

	return c.State.Create(ctx, r, opts...)
}

func (c *cuttable) Update(ctx context.Context, r resource.Resource, opts ...state.UpdateOption) error {
	if err := c.blocked(ctx); err != nil {
		return err
	}

	begun := time.Now()

	if err := c.State.Update(ctx, r, opts...); err != nil {
		return err
	}

	c.lastWrite.Store(begun.UnixNano())

	return nil
}

// acting counts the controllers acting at once and remembers the most there ever were.
type acting struct {
	now, most atomic.Int32
	by        sync.Map // holder -> true while acting
	stopped   sync.Map // holder -> when it was last told to stop
}

func (a *acting) lead(holder string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		n := a.now.Add(1)
		for {
			m := a.most.Load()
			if n <= m || a.most.CompareAndSwap(m, n) {
				break
			}
		}

		a.by.Store(holder, true)
		<-ctx.Done()
		a.stopped.Store(holder, time.Now())
		a.by.Delete(holder)
		a.now.Add(-1)

		return nil
	}
}

func (a *acting) who() []string {
	var out []string

	a.by.Range(func(k, _ any) bool {
		out = append(out, k.(string))

		return true
	})

	return out
}

type controller struct {
	name   string
	st     *cuttable
	cancel context.CancelFunc
	done   chan error
}

func config(holder string) lease.Config {
	return lease.Config{Holder: holder, Duration: 800 * time.Millisecond, Renew: 100 * time.Millisecond, Margin: 250 * time.Millisecond}
}

func start(t *testing.T, shared state.State, types resources.Types, a *acting, name string) *controller {
	t.Helper()

	c := &controller{name: name, st: &cuttable{State: shared}, done: make(chan error, 1)}

	e, err := lease.New(config(name), c.st, types, zaptest.NewLogger(t).Named(name), time.Now, prometheus.NewRegistry())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	c.cancel = cancel

	go func() { c.done <- e.Run(ctx, a.lead(name)) }()

	t.Cleanup(func() {
		cancel()
		<-c.done
	})

	return c
}

func setup(t *testing.T) (state.State, resources.Types) {
	t.Helper()

	types := resources.NewTypes("lease-test")
	require.NoError(t, types.Register())

	return state.WrapCore(namespaced.NewState(inmem.Build)), types
}

func holder(t *testing.T, st state.State, types resources.Types) string {
	t.Helper()

	rec, err := safe.StateGet[*resources.ControllerLease](t.Context(), st, types.NewControllerLease(resources.ControllerLeaseID).Metadata())
	if state.IsNotFoundError(err) {
		return ""
	}

	require.NoError(t, err)

	return rec.TypedSpec().Value.GetHolder()
}

func TestOneControllerActsAndAStandbyTakesOverWhenItLeaves(t *testing.T) {
	st, types := setup(t)
	a := &acting{}

	ctrls := map[string]*controller{}
	for _, name := range []string{"c1", "c2", "c3"} {
		ctrls[name] = start(t, st, types, a, name)
	}

	require.Eventually(t, func() bool { return len(a.who()) == 1 }, 5*time.Second, 10*time.Millisecond)
	first := a.who()[0]
	require.Equal(t, first, holder(t, st, types))

	// The holder stops (a controller shut down): it gives the lease up, and a standby acts well before a
	// whole lease duration would have passed.
	left := time.Now()
	ctrls[first].cancel()
	require.NoError(t, <-ctrls[first].done)
	ctrls[first].done <- nil // for the cleanup

	require.Eventually(t, func() bool { w := a.who(); return len(w) == 1 && w[0] != first }, 5*time.Second, 10*time.Millisecond)
	t.Logf("a standby acted %s after the holder left (lease duration %s)", time.Since(left), config("").Duration)
	require.Less(t, time.Since(left), config("").Duration, "a lease given up is taken at the next look")
	require.EqualValues(t, 1, a.most.Load(), "never two controllers acting at once")
}

func TestAHolderCutOffStopsBeforeAStandbyActs(t *testing.T) {
	st, types := setup(t)
	a := &acting{}

	c1 := start(t, st, types, a, "c1")
	require.Eventually(t, func() bool { return holder(t, st, types) == "c1" && len(a.who()) == 1 }, 5*time.Second, 10*time.Millisecond)
	c2 := start(t, st, types, a, "c2")

	// c1 can no longer reach Omni: it must stop acting on its own, and c2 take over only after that.
	cut := time.Now()
	c1.st.cut.Store(true)

	require.Eventually(t, func() bool { w := a.who(); return len(w) == 1 && w[0] == "c2" }, 10*time.Second, 10*time.Millisecond)
	t.Logf("c2 acted %s after c1 was cut off (lease duration %s)", time.Since(cut), config("").Duration)
	require.GreaterOrEqual(t, time.Since(cut), config("").Duration-config("").Renew,
		"a standby waits a whole lease duration on a record that does not change")
	require.EqualValues(t, 1, a.most.Load(), "c1 stopped before c2 acted")

	// c1 comes back: it stands by, it does not take the lease back.
	c1.st.cut.Store(false)
	require.Never(t, func() bool { w := a.who(); return len(w) != 1 || w[0] != "c2" }, 3*config("").Duration, 20*time.Millisecond)
	require.Equal(t, "c2", holder(t, st, types))
	_ = c2
}

func TestLeadReturningEndsTheRunAndGivesTheLeaseUp(t *testing.T) {
	st, types := setup(t)

	e, err := lease.New(config("c1"), st, types, zaptest.NewLogger(t), time.Now, nil)
	require.NoError(t, err)

	boom := errors.New("component failed")
	err = e.Run(t.Context(), func(context.Context) error { return boom })
	require.ErrorIs(t, err, boom)
	require.Empty(t, holder(t, st, types), "given up on the way out")
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]lease.Config{
		"no holder":         {Duration: time.Second, Renew: 100 * time.Millisecond, Margin: 100 * time.Millisecond},
		"renew too slow":    {Holder: "c", Duration: time.Second, Renew: 900 * time.Millisecond, Margin: 200 * time.Millisecond},
		"zero margin":       {Holder: "c", Duration: time.Second, Renew: 100 * time.Millisecond},
		"negative duration": {Holder: "c", Duration: -time.Second, Renew: 100 * time.Millisecond, Margin: 100 * time.Millisecond},
	} {
		require.Error(t, cfg.Validate(), name)
	}

	cfg := lease.Default()
	cfg.Holder = "c"
	require.NoError(t, cfg.Validate())
}

// A standby configured with a shorter lease than the holder's waits the holder's: it must not take over while
// the holder, by its own clock, still acts.
func TestAStandbyWaitsTheHoldersDuration(t *testing.T) {
	st, types := setup(t)
	a := &acting{}

	long := lease.Config{Holder: "c1", Duration: 2 * time.Second, Renew: 200 * time.Millisecond, Margin: 500 * time.Millisecond}
	c1 := &controller{name: "c1", st: &cuttable{State: st}, done: make(chan error, 1)}

	e1, err := lease.New(long, c1.st, types, zaptest.NewLogger(t).Named("c1"), time.Now, nil)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); <-c1.done }()

	go func() { c1.done <- e1.Run(ctx, a.lead("c1")) }()

	require.Eventually(t, func() bool { return holder(t, st, types) == "c1" }, 5*time.Second, 10*time.Millisecond)
	start(t, st, types, a, "c2") // its own lease: 800 ms

	cut := time.Now()
	c1.st.cut.Store(true)

	require.Eventually(t, func() bool { w := a.who(); return len(w) == 1 && w[0] == "c2" }, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(cut), long.Duration-config("").Renew, "the standby waited the holder's duration")
	require.EqualValues(t, 1, a.most.Load())
}

// A controller that crashed (its lease neither renewed nor given up) and starts again under the same holder name
// takes its own lease back at once: the record's holder is its dead predecessor.
func TestACrashedHolderRestartedTakesItsLeaseBackAtOnce(t *testing.T) {
	st, types := setup(t)
	a := &acting{}

	crashed := &cuttable{State: st}

	e, err := lease.New(config("c1"), crashed, types, zaptest.NewLogger(t).Named("c1-old"), time.Now, nil)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- e.Run(ctx, a.lead("c1-old")) }()

	require.Eventually(t, func() bool { return holder(t, st, types) == "c1" }, 5*time.Second, 10*time.Millisecond)

	// The crash: nothing it does reaches Omni any more, so the lease is not given up.
	crashed.cut.Store(true)
	cancel()
	<-done
	require.Equal(t, "c1", holder(t, st, types))

	restarted := time.Now()

	start(t, st, types, a, "c1")
	require.Eventually(t, func() bool { w := a.who(); return len(w) == 1 && w[0] == "c1" }, 5*time.Second, 10*time.Millisecond)
	require.Less(t, time.Since(restarted), config("").Duration, "taken back without waiting a lease duration")
}

// TestAHolderWhoseRenewalsHangStopsInTime: an Omni that never answers makes every renewal wait its whole
// timeout. The holder still stops acting Duration-Margin after its last renewal, not a renewal's timeout
// later; with a renew interval longer than the margin, waiting out the hung renewal would run into the
// time a standby may already act.
func TestAHolderWhoseRenewalsHangStopsInTime(t *testing.T) {
	st, types := setup(t)
	a := &acting{}

	cfg := lease.Config{Holder: "c1", Duration: 800 * time.Millisecond, Renew: 400 * time.Millisecond, Margin: 100 * time.Millisecond}
	require.NoError(t, cfg.Validate())

	shared := &cuttable{State: st}
	e, err := lease.New(cfg, shared, types, zaptest.NewLogger(t), time.Now, prometheus.NewRegistry())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- e.Run(ctx, a.lead("c1")) }()

	t.Cleanup(func() {
		cancel()
		<-done
	})

	// Renewed at least once, then Omni hangs.
	require.Eventually(t, func() bool { return shared.lastWrite.Load() != 0 }, 5*time.Second, 10*time.Millisecond)
	shared.hang.Store(true)

	require.Eventually(t, func() bool { return len(a.who()) == 0 }, 5*time.Second, 10*time.Millisecond)

	stopped, ok := a.stopped.Load("c1")
	require.True(t, ok)

	last := time.Unix(0, shared.lastWrite.Load())
	took := stopped.(time.Time).Sub(last)
	t.Logf("stopped acting %s after the last renewal was begun (stop by %s; a standby may act from %s)",
		took.Round(time.Millisecond), cfg.Duration-cfg.Margin, cfg.Duration)
	require.Less(t, took, cfg.Duration, "the holder still acted when a standby could take the lease")
}
