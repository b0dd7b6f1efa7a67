package timeline_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
)

// An observer sees every entry added, repeats included, with the machine's site; a repeated entry knows when
// it came first.
func TestObserveAndFirst(t *testing.T) {
	t.Parallel()

	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	book := timeline.New(timeline.DefaultConfig(), func() time.Time { return now })

	type seen struct {
		site string
		e    timeline.Entry
	}

	const id = "0e5a1ab0-0000-4000-8000-0000000fa001"

	var got []seen

	book.Observe(func(machineID, site string, e timeline.Entry) {
		require.Equal(t, id, machineID)

		got = append(got, seen{site, e})
	})

	book.Summarize(id, lifecycle.MachineSummary{Site: "s1", Phase: lifecycle.PhaseReady})

	for range 3 {
		book.Record(id, timeline.KindError, "site offline", true)
		now = now.Add(time.Minute)
	}

	require.Len(t, got, 4, "the phase entry and three errors")
	require.Equal(t, "s1", got[3].site)
	require.Equal(t, "site offline", got[3].e.Text)

	rec, ok := book.Get(id)
	require.True(t, ok)

	last := rec.Entries[len(rec.Entries)-1]
	require.Equal(t, 2, last.Repeats)
	require.Equal(t, time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), last.Since())
	require.Equal(t, time.Date(2026, 12, 4, 10, 2, 0, 0, time.UTC), last.At)
}
