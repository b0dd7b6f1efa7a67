package lifecycle_test

import (
	"errors"
	"testing"
	"time"

	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/stretchr/testify/assert"

	"github.com/outpost-metal/outpost/controller/lifecycle"
)

// TestAgentRestartIsNotAReboot: a machine waiting for its wipe whose agent exits (the real agent exits when its
// tunnel ends, and Talos starts it again) is not rebooted into agent mode while the agent may come back; back
// within the grace, it is wiped with no power action; gone past the grace, it is rebooted once.
func TestAgentRestartIsNotAReboot(t *testing.T) {
	t.Parallel()

	const grace = 30 * time.Second

	for name, comesBack := range map[string]bool{"back within the grace": true, "gone past the grace": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			h := newHarness(t, func(c *lifecycle.Config) { c.AgentReconnectGrace = grace })

			h.edge.Add("m1", "site-a")
			h.edge.FailCalls("m1", "WipeDisks", errors.New("the disk is busy"))
			h.omni("m1", accepted)
			h.eventually("a wipe tried", func() bool { return h.edge.Attempts("m1", "WipeDisks") > 0 })

			h.clock.Advance(2 * cooldown) // the power cooldown is not what holds the reboot back
			h.edge.SetAgent("m1", false)
			h.never("no reboot while the agent may come back", func() bool { return h.edge.Count("m1", "PowerCycle") > 0 })

			if comesBack {
				h.edge.SetAgent("m1", true)
				h.edge.FailCalls("m1", "WipeDisks", nil)
				h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "wiped, ready") })
				h.never("no power action at all", func() bool { return h.edge.Count("m1", "Power") > 0 })

				return
			}

			h.clock.Advance(grace + time.Second)
			h.eventually("rebooted into agent mode once the grace is over", func() bool {
				return h.edge.Count("m1", "PowerCycle") == 1
			})
		})
	}
}
