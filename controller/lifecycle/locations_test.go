package lifecycle_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/lifecycle"
)

func TestLocations(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	l := lifecycle.NewLocations(zaptest.NewLogger(t))

	_, ok := l.Locate(id)
	require.False(t, ok)

	moved, err := l.Seen("site-a", id)
	require.NoError(t, err)
	require.False(t, moved)

	require.NoError(t, l.AgentConnected("site-a", id, true))
	require.Equal(t, lifecycle.Location{SiteID: "site-a", AgentConnected: true}, must(l.Locate(id)))

	// the machine turns up at site-b: it moves there, its old tunnel state does not follow
	moved, err = l.Seen("site-b", id)
	require.NoError(t, err)
	require.True(t, moved)
	require.Equal(t, lifecycle.Location{SiteID: "site-b"}, must(l.Locate(id)))

	// a stale close from the old site changes nothing; the new site's tunnel counts
	require.NoError(t, l.AgentConnected("site-a", id, false))
	require.NoError(t, l.AgentConnected("site-b", id, true))
	require.Equal(t, lifecycle.Location{SiteID: "site-b", AgentConnected: true}, must(l.Locate(id)))

	l.SiteOffline("site-b")
	require.Equal(t, lifecycle.Location{SiteID: "site-b"}, must(l.Locate(id)))

	l.SetArch(id, "aarch64")
	require.Equal(t, "arm64", must(l.Locate(id)).Arch)
	l.SetArch(id, "mips")
	require.Equal(t, "arm64", must(l.Locate(id)).Arch, "unknown arch ignored")

	for _, bad := range []string{"", "../../etc", "m1", "4c4c4544-0042-3510-8052-b4c04f38483"} {
		_, err = l.Seen("site-a", bad)
		require.ErrorIs(t, err, lifecycle.ErrBadMachineID, bad)
		require.ErrorIs(t, l.AgentConnected("site-a", bad, false), lifecycle.ErrBadMachineID, bad)
	}
}

func must(loc lifecycle.Location, ok bool) lifecycle.Location {
	if !ok {
		panic("not located")
	}

	return loc
}

func FuzzLocationsSeen(f *testing.F) {
	l := lifecycle.NewLocations(zap.NewNop())

	f.Add("site-a", "4c4c4544-0042-3510-8052-b4c04f384833")
	f.Add("", "{4c4c4544-0042-3510-8052-b4c04f384833}")

	f.Fuzz(func(t *testing.T, site, id string) {
		if _, err := l.Seen(site, id); err == nil {
			loc, ok := l.Locate(id)
			require.True(t, ok)
			require.Equal(t, site, loc.SiteID)
		}
	})
}
