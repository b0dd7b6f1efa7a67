package lifecycle_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/shared/metal"
)

// kinds returns the kinds of a machine's timeline entries, and the texts of its phase entries.
func kinds(book *timeline.Book, id string) (all, phases []string) {
	rec, _ := book.Get(metal.ID(id))

	for _, e := range rec.Entries {
		all = append(all, e.Kind)
		if e.Kind == timeline.KindPhase {
			phases = append(phases, e.Text)
		}
	}

	return all, phases
}

// The lifecycle tells the journal each phase a machine goes through and what it did (wipe, power), in order.
func TestJournalFollowsTheLifecycle(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.stop()

	book := timeline.New(timeline.DefaultConfig(), h.clock.Now)
	h.journal = book
	h.start()

	h.installed("m1", "site-a")

	h.eventually("installed phase in the journal", func() bool {
		rec, _ := book.Get("m1")

		return rec.Phase == lifecycle.PhaseInstalled
	})

	all, phases := kinds(book, "m1")
	t.Logf("timeline kinds %v phases %v", all, phases)
	require.Subset(t, all, []string{timeline.KindBMC, timeline.KindWipeStarted, timeline.KindWipeFinished, timeline.KindPower, timeline.KindInstalled})
	require.Less(t, indexOf(all, timeline.KindWipeStarted), indexOf(all, timeline.KindWipeFinished))

	// phases in lifecycle order, ending installed (one may be skipped when a step finishes before the status
	// is next written, never gone back to)
	order := map[string]int{}
	for i, p := range lifecycle.Phases() {
		order[p] = i
	}

	require.NotEmpty(t, phases)

	last := -1

	for _, p := range phases {
		_, to, ok := strings.Cut(p, " → ")
		require.True(t, ok, p)
		require.GreaterOrEqual(t, order[to], last, "phases %v", phases)

		last = order[to]
	}

	require.Equal(t, order[lifecycle.PhaseInstalled], last, "phases %v", phases)

	rec, _ := book.Get("m1")
	require.Equal(t, "site-a", rec.Site)
	require.Equal(t, "ipmi", rec.BMCProtocol)
	require.NotEmpty(t, rec.BMCAddress)
}

// A step's error is recorded with its reason; the same error again is one entry with a repeat count.
func TestJournalRecordsErrors(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.stop()

	book := timeline.New(timeline.DefaultConfig(), h.clock.Now)
	h.journal = book
	h.start()

	h.edge.Add("m1", "site-a")
	h.edge.SetOffline("site-a", true)
	h.omni("m1", accepted)

	h.eventually("an error with its reason, repeated", func() bool {
		rec, _ := book.Get("m1")
		for _, e := range rec.Entries {
			if e.Kind == timeline.KindError && e.Error && e.Repeats > 0 {
				return true
			}
		}

		return false
	})
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}

	return -1
}

// TestErrorLine: a step's error reads cause first, the chain after it, so that a cut line still says why.
func TestErrorLine(t *testing.T) {
	t.Parallel()

	const id = "0e5a1ab0-0000-4000-8000-0000000fa001"

	agent := status.Error(codes.Unavailable, "failed to wipe disks: "+status.Error(codes.Unavailable, "wipe not started: the disk is busy").Error())

	for _, tc := range []struct {
		name, step string
		err        error
		wantPrefix string
	}{
		{
			name: "through the edge and the agent", step: "lifecycle.WipeController",
			err:        fmt.Errorf("wipe %s at site site1: %w", id, agent),
			wantPrefix: "Wipe: wipe not started: the disk is busy (wipe " + id + " at site site1: rpc error:",
		},
		{
			name: "the step's own words first", step: "lifecycle.WipeController",
			err:        lifecycle.Stated(fmt.Errorf("wipe %s at site site1: %w", id, status.Error(codes.DeadlineExceeded, "context deadline exceeded")), "no answer within 45s"),
			wantPrefix: "Wipe: no answer within 45s (wipe " + id,
		},
		{
			name: "no status in the chain", step: "lifecycle.PowerController",
			err:        fmt.Errorf("power status of %s at site site1: %w", id, errors.New("site offline")),
			wantPrefix: "Power: power status of " + id + " at site site1: site offline",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			line := lifecycle.ErrorLine(tc.step, tc.err)
			require.Truef(t, len(line) >= len(tc.wantPrefix) && line[:len(tc.wantPrefix)] == tc.wantPrefix, "%q", line)
			require.Contains(t, line, errors.Unwrap(tc.err).Error(), "the whole chain below the step's words is kept")
		})
	}
}

// TestWipeTimeoutReadsAsSuch: a wipe the far end ended at its deadline (the call's own, propagated) reads as
// no answer within the wipe timeout, even when this end's own deadline has not quite passed.
func TestWipeTimeoutReadsAsSuch(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.stop()

	book := timeline.New(timeline.DefaultConfig(), h.clock.Now)
	h.journal = book
	h.start()

	h.edge.Add("m1", "site-a")
	h.edge.FailCalls("m1", "WipeDisks", status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
	h.omni("m1", accepted)

	h.eventually("the wipe's error in the timeline", func() bool {
		rec, _ := book.Get("m1")
		for _, e := range rec.Entries {
			if e.Error && strings.HasPrefix(e.Text, "Wipe: no answer within 5s, the fast wipe's timeout (") {
				return true
			}
		}

		return false
	})
}
