package machines_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/machines"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Locations tells the lifecycle of every change to what it knows of a machine (so it is observed at once), and
// of nothing else: a watch list's repeated known state is no change.
func TestLocationsTellChanges(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	l := machines.NewLocations(zaptest.NewLogger(t))

	var told []string

	l.OnChange(func(machineID metal.ID) { told = append(told, machineID.String()) })

	take := func() []string {
		out := told
		told = nil

		return out
	}

	_, err := l.Seen("site-a", id)
	require.NoError(t, err)
	require.Equal(t, []string{id}, take(), "placed at a site")

	require.NoError(t, l.AgentConnected("site-a", id, true))
	require.Equal(t, []string{id}, take(), "agent tunnel open")

	l.PowerReported("site-a", id, bmcpb.PowerState_POWER_STATE_ON, "")
	require.Equal(t, []string{id}, take(), "power reported")

	l.PowerReported("site-a", id, bmcpb.PowerState_POWER_STATE_ON, "")
	require.Empty(t, take(), "the same state again is no change")

	l.PowerReported("site-a", id, bmcpb.PowerState_POWER_STATE_UNKNOWN, "bmc timeout")
	require.Equal(t, []string{id}, take(), "unknown, with a reason")

	l.PowerReported("site-a", id, bmcpb.PowerState_POWER_STATE_UNKNOWN, "bmc refused the password")
	require.Equal(t, []string{id}, take(), "another reason")

	l.PowerReported("site-b", id, bmcpb.PowerState_POWER_STATE_OFF, "")
	require.Empty(t, take(), "a report from a site the machine is not at")

	l.SiteOffline("site-a")
	require.Equal(t, []string{id}, take(), "its tunnel ended with the site's session")
}
