package lifecycle_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
)

// manualClock is a clock the test moves.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.now = c.now.Add(d)
}

func TestDuesOrderAndEarliestWins(t *testing.T) {
	t.Parallel()

	clock := &manualClock{now: time.Unix(1000, 0)}
	d := lifecycle.NewDues(clock.Now)

	d.After("obs", "m1", 30*time.Second)
	require.True(t, d.Woken(), "a first entry wakes the runner")
	d.After("obs", "m2", 10*time.Second)
	require.True(t, d.Woken(), "an entry earlier than all wakes the runner")
	d.After("obs", "m3", 20*time.Second)
	require.False(t, d.Woken(), "an entry behind the first does not")

	d.After("obs", "m1", time.Minute) // later than pending: the earlier stays
	d.After("power", "m1", 5*time.Second)
	require.Equal(t, 4, d.Pending())

	due, wait := d.Take(10)
	require.Empty(t, due)
	require.Equal(t, 5*time.Second, wait)

	clock.Advance(20 * time.Second)

	due, _ = d.Take(10)
	require.Equal(t, []string{"power/m1", "obs/m2", "obs/m3"}, due, "in time order, each once")

	clock.Advance(10 * time.Second)

	due, wait = d.Take(10)
	require.Equal(t, []string{"obs/m1"}, due, "the earlier of two asks for m1 (30 s, not 60 s)")
	require.Zero(t, wait)

	due, wait = d.Take(10)
	require.Empty(t, due)
	require.Zero(t, wait, "nothing pending")
}

func TestDuesCancelAndLimit(t *testing.T) {
	t.Parallel()

	clock := &manualClock{now: time.Unix(1000, 0)}
	d := lifecycle.NewDues(clock.Now)

	for i := range 10 {
		d.After("obs", fmt.Sprintf("m%d", i), time.Duration(i)*time.Second)
	}

	d.Cancel("obs", "m3")
	d.Cancel("obs", "unknown") // nothing to cancel
	require.Equal(t, 9, d.Pending())

	clock.Advance(time.Hour)

	first, _ := d.Take(4)
	require.Equal(t, []string{"obs/m0", "obs/m1", "obs/m2", "obs/m4"}, first)

	rest, _ := d.Take(100)
	require.Len(t, rest, 5)
	require.Zero(t, d.Pending())

	d.After("obs", "m0", -time.Second) // overdue: at once
	due, _ := d.Take(1)
	require.Equal(t, []string{"obs/m0"}, due)
}

// BenchmarkDuesRequeue is one machine's look rescheduled among 20,000 pending (the steady fleet's poll): the
// schedule's cost per requeue, O(log n), against COSI's queue scan, O(n).
func BenchmarkDuesRequeue(b *testing.B) {
	clock := &manualClock{now: time.Unix(1000, 0)}
	d := lifecycle.NewDues(clock.Now)

	const machines = 20000

	ids := make([]string, machines)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%05d", i)
		d.After("obs", ids[i], time.Duration(i)*time.Millisecond)
	}

	b.ReportAllocs()
	b.ResetTimer()

	for i := range b.N {
		id := ids[i%machines]
		d.Cancel("obs", id)
		d.After("obs", id, 30*time.Second)
	}
}

// TestFirstFailureRetriedSoon: a step's first failure at a machine is tried again after two seconds, not a
// poll interval (most failures are a busy BMC the next try gets through); failing again it waits twice as
// long each time, up to the interval it asked for, and a look that did not fail starts the count again. A
// BMC's refusal, retried slowly on purpose, is not hurried.
func TestFirstFailureRetriedSoon(t *testing.T) {
	t.Parallel()

	cfg := lifecycle.Default()
	poll := cfg.PollInterval
	clock := &manualClock{now: time.Unix(1_700_000_000, 0)}
	busy := errors.New("bmc busy")

	got := lifecycle.NextLooks(cfg, clock.Now,
		controller.NewRequeueError(busy, poll),    // first failure
		controller.NewRequeueError(busy, poll),    // second in a row
		controller.NewRequeueError(busy, poll),    // third
		controller.NewRequeueError(busy, poll),    // fourth
		controller.NewRequeueError(busy, poll),    // fifth: the interval asked for
		controller.NewRequeueError(busy, poll),    // and so on
		controller.NewRequeueInterval(poll),       // a wait, not a failure
		controller.NewRequeueError(busy, poll),    // first failure again
		nil,                                       // done
		controller.NewRequeueError(busy, 10*poll), // a refusal: slow on purpose
	)

	require.Equal(t, []time.Duration{
		2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, poll, poll,
		poll, 2 * time.Second, -1, 10 * poll,
	}, got)
}
