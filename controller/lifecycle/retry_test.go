package lifecycle_test

import (
	"fmt"
	"io"
	"testing"
	"time"

	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/lifecycle"
)

// TestFailedCallsRetriedAfterAPause: an agent or BMC call broken by an uplink cut (Unavailable, EOF) while
// the agent still looks connected is tried again after a pause, never in a loop, by every step that calls
// out, and is not dropped either: once the call gets through, the step's work is done. Measured before the
// fix: the wipe step made 6,891-10,255 attempts in about a second in the lab, and thousands in this test.
func TestFailedCallsRetriedAfterAPause(t *testing.T) {
	t.Parallel()

	const (
		poll = time.Second // as in the lab where the loop was measured: every failure logged "interval 1s"
		// window is how long the attempts are counted after the first; with one retry per poll interval at
		// most two more fit in it (the loop made thousands).
		window  = 1500 * time.Millisecond
		retries = 2
	)

	cut := status.Error(codes.Unavailable, "error reading from server: EOF")

	for _, tc := range []struct {
		name string
		call string
		err  error
		// start brings m1 to where call is made (call fails from the start: the steps before do not make it).
		start func(h *harness)
		// done waits for the step's work once call gets through.
		done func(h *harness)
	}{
		{
			name: "wipe, unavailable",
			call: "WipeDisks",
			err:  cut,
			start: func(h *harness) {
				h.edge.Add("m1", "site-a")
				h.omni("m1", accepted)
			},
			done: func(h *harness) {
				h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
			},
		},
		{
			name: "wipe, eof",
			call: "WipeDisks",
			err:  fmt.Errorf("wipe disks: %w", io.EOF),
			start: func(h *harness) {
				h.edge.Add("m1", "site-a")
				h.omni("m1", accepted)
			},
			done: func(h *harness) {
				h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
			},
		},
		{
			name: "bmc configuration",
			call: "GetPowerManagement",
			err:  cut,
			start: func(h *harness) {
				h.edge.Add("m1", "site-a")
				h.omni("m1", accepted)
			},
			done: func(h *harness) {
				h.eventually("bmc user provisioned", func() bool { return h.edge.Machine("m1").IPMIUser != "" })
			},
		},
		{
			name: "power",
			call: "PowerOn",
			err:  cut,
			start: func(h *harness) {
				h.ready("m1", "site-a")
				h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
			},
			done: func(h *harness) {
				h.eventually("powered on", func() bool { return h.edge.Machine("m1").Power })
			},
		},
		{
			name: "reboot",
			call: "PowerCycle",
			err:  cut,
			start: func(h *harness) {
				h.ready("m1", "site-a")
				h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
				h.eventually("powered on", func() bool { return h.edge.Machine("m1").Power })
				h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.RequestedRebootId = "reboot-1" })
			},
			done: func(h *harness) {
				h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
					a.Equal("reboot-1", s.LastRebootId, "reboot reported")
				})
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			h := newHarness(t, func(c *lifecycle.Config) { c.PollInterval = poll })
			attempts := func() int { return h.edge.Attempts("m1", tc.call) }

			h.edge.FailCalls("m1", tc.call, tc.err)
			tc.start(h)

			h.eventually("the call is made", func() bool { return attempts() > 0 })
			first := attempts()
			require.Never(t, func() bool { return attempts() > first+retries }, window, tick,
				"%s tried again at most %d times in %s", tc.call, retries, window)
			t.Logf("%s: %d attempts in the window after the first failure", tc.call, attempts()-first)

			h.eventually("tried again after the pause", func() bool { return attempts() > first })

			h.edge.FailCalls("m1", tc.call, nil)
			tc.done(h)
			require.Positive(t, h.stats.Count(lifecycle.ReasonEdgeCallFailed), "the failures are counted")
		})
	}
}
