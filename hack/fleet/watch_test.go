package fleet_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/hack/fleet"
)

// The edge's watcher asks a simulated BMC with the credentials of its watch list, as the edge's Manager does:
// a poll without them was refused by every BMC, and power ages measured nothing but that refusal.
func TestWatchPollCarriesCredentials(t *testing.T) {
	t.Parallel()

	s := fleet.NewTestBMCService(fleet.BMCBehaviour{DeadAfter: 50 * time.Millisecond}, time.Second, nil, "127.64.0.1")
	target := bmc.Target{Host: "127.64.0.1", IPMIPort: 623}

	on, err := s.WatchPoll(t.Context(), target, bmc.Credentials{Username: "outpost", Password: "secret"})
	require.NoError(t, err)
	require.False(t, on, "a machine never started is off")

	_, err = s.WatchPoll(t.Context(), target, bmc.Credentials{Username: "outpost", Password: "guess"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
}
