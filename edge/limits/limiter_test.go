package limits_test

import (
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outpost-metal/outpost/edge/limits"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	srcA = netip.MustParseAddr("10.0.0.1")
	srcB = netip.MustParseAddr("10.0.0.2")
	srcC = netip.MustParseAddr("10.0.0.3")
)

// evictions records which holdings were evicted, by name.
type evictions struct {
	mu  sync.Mutex
	got []string
}

func (e *evictions) fn(name string) func() {
	return func() {
		e.mu.Lock()
		e.got = append(e.got, name)
		e.mu.Unlock()
	}
}

func (e *evictions) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()

	return append([]string(nil), e.got...)
}

func TestLimiterRefuses(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		cfg     limits.Config
		sources []netip.Addr // acquired in order; the last one is refused
		reason  limits.Reason
	}{
		{name: "per source", cfg: limits.Config{Total: 10, PerSource: 2}, sources: []netip.Addr{srcA, srcA, srcB, srcA}, reason: limits.PerSource},
		{name: "total", cfg: limits.Config{Total: 3, PerSource: 2}, sources: []netip.Addr{srcA, srcB, srcA, srcC}, reason: limits.Total},
		{name: "mapped v4 is the same source", cfg: limits.Config{PerSource: 1}, sources: []netip.Addr{srcA, netip.AddrFrom16(srcA.As16())}, reason: limits.PerSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			l := limits.New(tc.cfg)

			for _, src := range tc.sources[:len(tc.sources)-1] {
				_, err := l.Acquire(src, nil)
				require.NoError(t, err)
			}

			last := tc.sources[len(tc.sources)-1]
			_, err := l.Acquire(last, nil)

			re, ok := limits.AsRefused(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, tc.reason, re.Reason)
			require.Equal(t, last.Unmap(), re.Source)
			require.Equal(t, int64(1), l.Stats().Refused[tc.reason])
		})
	}
}

func TestLimiterReleaseFrees(t *testing.T) {
	t.Parallel()

	l := limits.New(limits.Config{Total: 2, PerSource: 1})

	a, err := l.Acquire(srcA, nil)
	require.NoError(t, err)

	_, err = l.Acquire(srcA, nil)
	require.Error(t, err)

	a.Release()
	a.Release() // twice is harmless
	require.Zero(t, l.Held(srcA))

	_, err = l.Acquire(srcA, nil)
	require.NoError(t, err)

	st := l.Stats()
	require.Equal(t, 1, st.Held)
	require.Equal(t, 1, st.Sources)
	require.Equal(t, 1, st.Peak)
}

func TestLimiterEvictsOldestEvictable(t *testing.T) {
	t.Parallel()

	ev := &evictions{}
	l := limits.New(limits.Config{Total: 3, PerSource: 2})

	a1, err := l.Acquire(srcA, ev.fn("a1"))
	require.NoError(t, err)

	_, err = l.Acquire(srcB, ev.fn("b1"))
	require.NoError(t, err)

	_, err = l.Acquire(srcA, ev.fn("a2"))
	require.NoError(t, err)

	// a1 answered: it is not evictable any more. The total is reached: the oldest evictable (b1) makes room.
	a1.SetEvictable(false)

	_, err = l.Acquire(srcC, ev.fn("c1"))
	require.NoError(t, err)
	require.Equal(t, []string{"b1"}, ev.list())

	// srcA is at its per-source bound: its own oldest evictable holding (a2, not a1) makes room.
	_, err = l.Acquire(srcA, ev.fn("a3"))
	require.NoError(t, err)
	require.Equal(t, []string{"b1", "a2"}, ev.list())

	// a1 became idle: it joins the end of the line.
	a1.SetEvictable(true)

	_, err = l.Acquire(srcB, ev.fn("b2"))
	require.NoError(t, err)
	require.Equal(t, []string{"b1", "a2", "c1"}, ev.list())

	st := l.Stats()
	require.Equal(t, 3, st.Held)
	require.Equal(t, int64(2), st.Evicted[limits.Total])
	require.Equal(t, int64(1), st.Evicted[limits.PerSource])
}

func TestLimiterNeverEvictsTheUnevictable(t *testing.T) {
	t.Parallel()

	ev := &evictions{}
	l := limits.New(limits.Config{Total: 2})

	for _, name := range []string{"x", "y"} {
		s, err := l.Acquire(srcA, ev.fn(name))
		require.NoError(t, err)
		s.SetEvictable(false)
	}

	_, err := l.Acquire(srcB, ev.fn("z"))
	re, ok := limits.AsRefused(err)
	require.True(t, ok)
	require.Equal(t, limits.Total, re.Reason)
	require.Empty(t, ev.list())
}

func TestLimiterEvictedSlotReleaseIsHarmless(t *testing.T) {
	t.Parallel()

	ev := &evictions{}
	l := limits.New(limits.Config{Total: 1})

	old, err := l.Acquire(srcA, ev.fn("old"))
	require.NoError(t, err)

	_, err = l.Acquire(srcB, ev.fn("new"))
	require.NoError(t, err)

	old.Release()
	old.SetEvictable(false)
	require.Equal(t, 1, l.Stats().Held)
	require.Zero(t, l.Held(srcA))
	require.Equal(t, 1, l.Held(srcB))
}

func TestLimiterConcurrent(t *testing.T) {
	t.Parallel()

	l := limits.New(limits.Config{Total: 50, PerSource: 10})

	var wg sync.WaitGroup

	for i := range 16 {
		wg.Go(func() {
			src := netip.AddrFrom4([4]byte{10, 1, 0, byte(i % 8)})

			for range 500 {
				s, err := l.Acquire(src, func() {})
				if err == nil {
					s.SetEvictable(false)
					s.SetEvictable(true)
					s.Release()
				}
			}
		})
	}

	wg.Wait()

	st := l.Stats()
	require.Zero(t, st.Held)
	require.Zero(t, st.Sources)
	require.Zero(t, st.Evictable)
	require.LessOrEqual(t, st.Peak, 50)
}

func TestLimiterCollector(t *testing.T) {
	t.Parallel()

	l := limits.New(limits.Config{PerSource: 1})

	_, err := l.Acquire(srcA, nil)
	require.NoError(t, err)

	_, err = l.Acquire(srcA, nil)
	require.Error(t, err)

	reg := prometheus.NewRegistry()
	reg.MustRegister(l.Collector("outpost_test_things", "Test things"))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outpost_test_things_held Test things held now.
# TYPE outpost_test_things_held gauge
outpost_test_things_held 1
# HELP outpost_test_things_refused_total Test things refused at a limit, by reason (per_source, total).
# TYPE outpost_test_things_refused_total counter
outpost_test_things_refused_total{reason="per_source"} 1
outpost_test_things_refused_total{reason="total"} 0
`), "outpost_test_things_held", "outpost_test_things_refused_total"))
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()

	require.NoError(t, limits.Config{}.Validate())
	require.NoError(t, limits.Config{Total: 10, PerSource: 10}.Validate())
	require.Error(t, limits.Config{Total: -1}.Validate())
	require.Error(t, limits.Config{Total: 5, PerSource: 6}.Validate())
}
