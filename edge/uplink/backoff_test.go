package uplink_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/uplink"
)

// The first retry is jittered too: edges that lost their sessions together (a controller restart) must not
// all come back at the same instant (they used to wait exactly BackoffMin).
func TestBackoffJitteredFromTheFirstAttempt(t *testing.T) {
	t.Parallel()

	const (
		lo    = 500 * time.Millisecond
		hi    = time.Minute
		edges = 500
	)

	firsts := map[time.Duration]bool{}

	for range edges {
		b := uplink.NewBackoff(lo, hi)
		first := b.Next()
		require.GreaterOrEqual(t, first, lo)
		require.LessOrEqual(t, first, 2*lo)

		firsts[first.Truncate(10*time.Millisecond)] = true

		// Each next wait comes from a range twice as high, up to [hi/2, hi].
		ceiling := 2 * lo

		for range 12 {
			ceiling = min(2*ceiling, hi)
			d := b.Next()
			require.GreaterOrEqual(t, d, ceiling/2)
			require.LessOrEqual(t, d, ceiling)
		}

		b.Reset()
		require.LessOrEqual(t, b.Next(), 2*lo)
	}

	require.Greater(t, len(firsts), 30, "first waits of %d edges fall in only %d 10 ms buckets", edges, len(firsts))
}

func TestBackoffFixed(t *testing.T) {
	t.Parallel()

	b := uplink.NewBackoff(time.Hour, time.Hour)
	require.Equal(t, time.Hour, b.Next())
	require.Equal(t, time.Hour, b.Next())
}

func TestHonourRetryAfter(t *testing.T) {
	t.Parallel()

	require.Equal(t, time.Second, uplink.HonourRetryAfter(time.Second, 0), "no hint: the backoff's wait")
	require.Equal(t, time.Hour, uplink.HonourRetryAfter(time.Hour, 5*time.Second), "a longer backoff stays")

	seen := map[time.Duration]bool{}

	for range 200 {
		d := uplink.HonourRetryAfter(time.Second, 10*time.Second)
		require.GreaterOrEqual(t, d, 10*time.Second)
		require.LessOrEqual(t, d, 15*time.Second)

		seen[d.Truncate(100*time.Millisecond)] = true
	}

	require.Greater(t, len(seen), 10, "edges told to wait come back spread out")
}
