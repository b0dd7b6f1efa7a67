package lifecycle_test

import (
	"testing"

	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/timeline"
)

// A wipe or a power cycle the edge carried out whose answer was lost (an uplink cut just after) is recorded
// from the edge's word, not sent again: the machine is wiped once and cycled once.
func TestLostAnswerIsNotRepeated(t *testing.T) {
	t.Parallel()

	t.Run("wipe", func(t *testing.T) {
		t.Parallel()

		h := newHarness(t)
		h.edge.LoseReplies("m1", "WipeDisks", 1)
		h.ready("m1", "site-a")

		h.never("a second wipe", func() bool { return h.edge.Count("m1", "WipeDisks") > 1 })
		require.Equal(t, 1, h.edge.Count("m1", "WipeDisks"), "wiped once")
		require.Equal(t, 1, h.edge.Attempts("m1", "WipeDisks"), "sent once: the edge said it was done")
	})

	t.Run("power cycle", func(t *testing.T) {
		t.Parallel()

		h := newHarness(t)
		h.ready("m1", "site-a")
		h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
		h.eventually("powered on", func() bool { return h.edge.Machine("m1").Power })

		h.edge.LoseReplies("m1", "PowerCycle", 1)
		h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.RequestedRebootId = "reboot-1" })

		h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) {
			a.Equal("reboot-1", s.LastRebootId, "reboot reported")
		})
		h.never("a second power cycle", func() bool { return h.edge.Count("m1", "PowerCycle") > 1 })
		require.Equal(t, 1, h.edge.Count("m1", "PowerCycle"))
	})
}

// A controller that crashes while a wipe runs at the edge leaves the wipe's intent open in Omni; the next
// controller (new process: no memory of it) asks the edge, joins the wipe under the same ID and records it.
// The disks are wiped once.
func TestControllerCrashDuringWipe(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	release := make(chan struct{})
	h.edge.HoldWipes(release)
	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	h.eventually("the wipe reached the machine", func() bool { return h.edge.Count("m1", "WipeDisks") == 1 })

	h.stop()  // the controller dies; its wipe call goes on at the edge (detached there)
	h.start() // a new controller: new controllers, no in-process record of the wipe
	close(release)

	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
	h.never("a second wipe", func() bool { return h.edge.Count("m1", "WipeDisks") > 1 })
	require.Equal(t, 1, h.edge.Count("m1", "WipeDisks"), "wiped once")
}

// An edge that restarts during a wipe cannot say whether the disks were wiped: the controller says so in the
// machine's timeline and wipes again under a new intent (a missed wipe is worse than a second one).
func TestEdgeRestartDuringWipeIsAnAlert(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.stop()

	book := timeline.New(timeline.DefaultConfig(), h.clock.Now)
	h.journal = book
	h.start()

	release := make(chan struct{})
	h.edge.HoldWipes(release)
	h.edge.LoseReplies("m1", "WipeDisks", 1) // the cut that came with the restart
	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	h.eventually("the wipe reached the machine", func() bool { return h.edge.Count("m1", "WipeDisks") == 1 })
	h.edge.RestartIntents()
	h.edge.HoldWipes(nil)
	close(release)

	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.True(s.ReadyToUse, "ready to use") })
	require.Equal(t, 2, h.edge.Count("m1", "WipeDisks"), "wiped again under a new intent")

	rec, _ := book.Get("m1")

	var alerts []string

	for _, e := range rec.Entries {
		if e.Kind == timeline.KindIntent {
			alerts = append(alerts, e.Text)
		}
	}

	require.Len(t, alerts, 1)
	require.Contains(t, alerts[0], "whether the disks were wiped is unknown")
}
