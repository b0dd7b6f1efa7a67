package fidelity_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/fidelity"
)

// TestFidelity runs the contract scenario against the stand-in and, where one can be built and started here
// (root, the module proxy), against a real Omni v1.9.3, and requires both transcripts to agree step by step.
func TestFidelity(t *testing.T) {
	t.Parallel() // beside TestControllerOutlivesWatchBudget, which mostly waits

	standIn, err := fidelity.StartStandIn("bare-metal", zaptest.NewLogger(t).Named("stand-in"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, standIn.Stop()) })

	want := scenario(t, standIn)
	logTranscript(t, standIn.Name(), want)

	real, reason := startRealOmni(t)
	if real == nil {
		t.Skipf("stand-in transcript recorded; no real Omni to compare with: %s", reason)
	}

	got := scenario(t, real)
	logTranscript(t, real.Name(), got)

	compare(t, want, got)
}

func logTranscript(t *testing.T, name string, tr *transcript) {
	t.Helper()

	var b strings.Builder

	for _, s := range tr.steps {
		if s.skipped != "" {
			fmt.Fprintf(&b, "  %-22s skipped: %s\n", s.name, s.skipped)

			continue
		}

		fmt.Fprintf(&b, "  %-22s %s\n", s.name, strings.Join(s.observed, " "))
	}

	t.Logf("transcript against the %s:\n%s", name, b.String())
}

// compare requires the same steps with the same observations; a step only one side could take is listed.
func compare(t *testing.T, standIn, real *transcript) {
	t.Helper()

	require.Len(t, real.steps, len(standIn.steps), "both runs take the same steps")

	for i, s := range standIn.steps {
		r := real.steps[i]
		require.Equal(t, s.name, r.name)

		if s.skipped != "" || r.skipped != "" {
			t.Logf("step %q compared on one side only: stand-in %q, real %q", s.name, s.skipped, r.skipped)

			continue
		}

		require.Equal(t, s.observed, r.observed, "step %q: the stand-in differs from the real Omni", s.name)
	}
}
