package linklab_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

// TestEdgeReleaseSkew: a controller accepts edges of its own minor release and of the one before (a fleet is
// upgraded over days), refuses older and newer ones with a reason both ends show, and forgets the refusal
// once the site's edge is upgraded and connects.
func TestEdgeReleaseSkew(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{Version: "v0.4.1"})

	siteOf := func(id string) *adminpb.Site {
		resp, err := ctrl.Admin.ListSites(t.Context(), &adminpb.ListSitesRequest{})
		require.NoError(t, err)

		for _, s := range resp.GetSites() {
			if s.GetSiteId() == id {
				return s
			}
		}

		t.Fatalf("site %s not listed", id)

		return nil
	}

	// Same line (another patch) and one minor behind: connected, and the site shows the edge's release.
	for id, v := range map[string]string{"same": "v0.4.0", "behind": "v0.3.7-2-gabc1234"} {
		linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, id, sites.TokenOptions{}), linklab.EdgeOptions{Options: edgeuplink.Options{Version: v}})
		ctrl.WaitConnected(t, id)
		require.Equal(t, v, siteOf(id).GetEdgeVersion())
		require.Empty(t, siteOf(id).GetEdgeRefused())
	}

	// Two behind and newer: refused at enrolment with the reason at both ends, the site keeps the reason.
	for _, tc := range []struct{ id, version, want string }{
		{"old", "v0.2.9", "edge v0.2.9 is too old for controller v0.4.1, which accepts edges of v0.4.x and v0.3.x"},
		{"new", "v0.5.0", "edge v0.5.0 is newer than controller v0.4.1: upgrade the controller first"},
		{"garbage", "v0.4", "the edge reports version \"v0.4\", which is not a release version"},
	} {
		core, logs := observer.New(zap.InfoLevel)
		dir := t.TempDir()
		token := ctrl.CreateSite(t, tc.id, sites.TokenOptions{})
		edge := linklab.StartEdge(t, ctrl.Addr, token,
			linklab.EdgeOptions{StateDir: dir, Options: edgeuplink.Options{Version: tc.version, Logger: zap.New(core)}})

		require.Eventually(t, func() bool {
			return logs.FilterMessageSnippet("the controller does not accept this edge's release").Len() > 0
		}, 10*time.Second, 10*time.Millisecond, "edge %s: no refusal logged", tc.version)

		entry := logs.FilterMessageSnippet("does not accept").All()[0]
		require.Contains(t, entry.ContextMap()["reason"], tc.want)
		require.Equal(t, "v0.4.1", entry.ContextMap()["controller_version"])
		require.False(t, ctrl.Server.Connected(tc.id))
		require.Contains(t, siteOf(tc.id).GetEdgeRefused(), tc.want)
		require.NotNil(t, siteOf(tc.id).GetEdgeRefusedAt())
		require.GreaterOrEqual(t, rejectedCount(t, ctrl, "edge_version"), 1.0)

		if tc.id != "old" {
			continue
		}

		// The appliance is upgraded: same state directory, same token (still unused), the controller's release.
		_ = edge.Stop() // the run ends with the cancellation's error, or none

		linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{StateDir: dir, Options: edgeuplink.Options{Version: "v0.4.1"}})
		ctrl.WaitConnected(t, tc.id)
		require.Empty(t, siteOf(tc.id).GetEdgeRefused(), "the refusal is forgotten once the site connects")
		require.Equal(t, "v0.4.1", siteOf(tc.id).GetEdgeVersion())
	}
}
