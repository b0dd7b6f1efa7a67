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

// TestPacerComesBackQuicklyAfterAControllerGoesAway: a session that held and ended (a controller restarted or
// failed over) makes the next attempts come at the shortest waits for the quick window, even when the edge
// had backed off to the longest before; a session that drops as soon as it is up does not, and attempts that
// never connect back off as before.
func TestPacerComesBackQuicklyAfterAControllerGoesAway(t *testing.T) {
	t.Parallel()

	const (
		lo = 500 * time.Millisecond
		hi = time.Minute
	)

	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	p := uplink.NewPacer(lo, hi)

	// A WAN cut: attempts fail and the waits grow to the longest.
	var wait time.Duration
	for range 10 {
		wait = p.After(now, time.Time{}, now.Add(time.Second))
		now = now.Add(time.Second + wait)
	}

	require.GreaterOrEqual(t, wait, hi/2, "the failing attempts did not back off")

	// The next attempt connects; its session holds for 15 s, then the controller is killed. Until the
	// quick window after that end has passed, every failing attempt waits only [lo, 2*lo].
	up := now.Add(100 * time.Millisecond)
	end := up.Add(uplink.StableSession + 5*time.Second)
	wait = p.After(now, up, end)
	attempts := 1

	for now = end.Add(wait); now.Before(end.Add(uplink.QuickRetryWindow)); attempts++ {
		require.GreaterOrEqual(t, wait, lo)
		require.LessOrEqual(t, wait, 2*lo, "attempt %d after a held session ended waits %s", attempts, wait)

		wait = p.After(now, time.Time{}, now.Add(10*time.Millisecond))
		now = now.Add(10*time.Millisecond + wait)
	}

	require.Greater(t, attempts, 20, "too few attempts in the quick window")

	// Past the quick window, failures back off again (from the shortest range up).
	for range 4 {
		wait = p.After(now, time.Time{}, now.Add(10*time.Millisecond))
		now = now.Add(10*time.Millisecond + wait)
	}

	require.Greater(t, wait, 2*lo, "still at the shortest waits after the quick window")

	// A session that drops right after coming up is not a controller going away: no quick window.
	q := uplink.NewPacer(lo, hi)
	for range 10 {
		start := now
		wait = q.After(start, start.Add(50*time.Millisecond), start.Add(time.Second))
		now = start.Add(time.Second + wait)
	}

	require.Greater(t, wait, 2*lo, "sessions dropped at once kept every attempt at the shortest waits")
}
