package limits_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/edge/limits"
)

// fakeClock is a Clock moved by hand; due timers run inside Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()

	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)

	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()

		was := !t.stopped
		t.stopped = true

		return was
	}
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)

	var due []*fakeTimer

	rest := c.timers[:0]

	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			rest = append(rest, t)
		}
	}

	c.timers = rest
	c.mu.Unlock()

	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })

	for _, t := range due {
		t.f()
	}
}

type line struct {
	reason string
	count  int64
	remote string
}

func lines(logs *observer.ObservedLogs) []line {
	var out []line

	for _, e := range logs.All() {
		m := e.ContextMap()
		l := line{reason: m["reason"].(string), count: m["count"].(int64)}

		if r, ok := m["remote"].(string); ok {
			l.remote = r
		}

		out = append(out, l)
	}

	return out
}

func TestRejectLogOneLinePerReasonPerInterval(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zapcore.DebugLevel)
	clock := newFakeClock()
	rl := limits.NewRejectLog(zap.New(core), "refused", 10*time.Second, clock)

	// A flood: 10,000 refusals of one reason over 25 s, and one of another reason.
	for i := range 10_000 {
		rl.Note("per_source", zap.String("remote", "10.0.0.1"), zap.Int("i", i))

		if i == 5000 {
			rl.Note("total", zap.String("remote", "10.0.0.9"))
		}

		if i%400 == 399 {
			clock.Advance(time.Second)
		}
	}

	require.Equal(t, []line{
		{reason: "per_source", count: 1, remote: "10.0.0.1"},
		{reason: "per_source", count: 3999, remote: "10.0.0.1"}, // 10 s after the first line
		{reason: "total", count: 1, remote: "10.0.0.9"},
		{reason: "per_source", count: 4000, remote: "10.0.0.1"}, // 20 s
	}, lines(logs))

	// The rest of the flood is summed up when its interval ends, without another refusal.
	clock.Advance(10 * time.Second)
	require.Equal(t, line{reason: "per_source", count: 2000, remote: "10.0.0.1"}, lines(logs)[4])
	require.Equal(t, zapcore.WarnLevel, logs.All()[0].Level)

	// Quiet for an interval: the next refusal is logged at once again.
	clock.Advance(time.Minute)
	rl.Note("per_source", zap.String("remote", "10.0.0.2"))
	require.Equal(t, line{reason: "per_source", count: 1, remote: "10.0.0.2"}, lines(logs)[5])
	require.Len(t, logs.All(), 6)
}

func TestRejectLogFlushWritesPending(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zapcore.DebugLevel)
	clock := newFakeClock()
	rl := limits.NewRejectLog(zap.New(core), "refused", time.Minute, clock)

	for range 5 {
		rl.Note("total")
	}

	rl.Flush()
	clock.Advance(time.Hour) // the stopped timer writes nothing
	require.Equal(t, []line{{reason: "total", count: 1}, {reason: "total", count: 4}}, lines(logs))

	// Still working after a flush.
	rl.Note("total")
	require.Equal(t, line{reason: "total", count: 1}, lines(logs)[2])
}

func TestRejectLogWallClock(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zapcore.DebugLevel)
	rl := limits.NewRejectLog(zap.New(core), "refused", 20*time.Millisecond, nil)

	defer rl.Flush()

	rl.Note("x")
	rl.Note("x")
	rl.Note("x")

	require.Eventually(t, func() bool { return logs.Len() == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []line{{reason: "x", count: 1}, {reason: "x", count: 2}}, lines(logs))
}
