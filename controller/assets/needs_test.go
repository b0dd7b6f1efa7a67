package assets_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

func names(refs []*assetsapi.AssetRef) []string {
	out := make([]string, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.GetName())
	}

	return out
}

func TestNeedsFollowPlans(t *testing.T) {
	t.Parallel()

	cat := assets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil)
	agent := []*assetsapi.AssetRef{{Name: "agent/x86_64/vmlinuz", Sha256: "a"}}
	kernel := &assetsapi.AssetRef{Name: "install/s/v1.11.0/kernel-amd64", Sha256: "k"}
	needs := assets.NewNeeds(cat, nil, agent)

	needs.Site("a")
	require.Equal(t, []string{"agent/x86_64/vmlinuz"}, names(cat.Site("a").Missing))

	needs.SetMachine("a", "m1", []*assetsapi.AssetRef{kernel})
	needs.SetMachine("a", "m2", []*assetsapi.AssetRef{kernel})
	require.Equal(t, []string{"agent/x86_64/vmlinuz", "install/s/v1.11.0/kernel-amd64"}, names(cat.Site("a").Missing))

	// m1 moves to site b; m2 still needs the kernel at a.
	needs.SetMachine("b", "m1", []*assetsapi.AssetRef{kernel})
	require.Equal(t, []string{"agent/x86_64/vmlinuz", "install/s/v1.11.0/kernel-amd64"}, names(cat.Site("b").Missing))
	require.Equal(t, []string{"agent/x86_64/vmlinuz", "install/s/v1.11.0/kernel-amd64"}, names(cat.Site("a").Missing))

	// m2 boots its disk now: a no longer needs the kernel.
	needs.SetMachine("a", "m2", nil)
	require.Equal(t, []string{"agent/x86_64/vmlinuz"}, names(cat.Site("a").Missing))
}

func TestNeedsAskTheLibraryForUpstreamAssetsOfSitesThatHoldThem(t *testing.T) {
	t.Parallel()

	up, srv := serveUpstream(t)
	kernel, sum := randomBytes(t, 5000)
	up.set("/k", kernel, 0)

	lib := startLibrary(t, assets.DefaultLibrary(t.TempDir(), srv.Client()))
	cat := assets.NewCatalog(assetsapi.Policy_POLICY_PASSTHROUGH, nil)
	require.NoError(t, cat.SetPolicy("cached", assetsapi.Policy_POLICY_CACHE))

	needs := assets.NewNeeds(cat, lib, nil)

	runNeeds(t, needs)

	w := assets.Want{Name: "talos/v1.11.0/s/amd64/kernel", URL: srv.URL + "/k"}

	// a passthrough site's machines fetch upstream themselves: the controller fetches nothing for it
	needs.SetMachine("passing", "m1", nil, w)
	require.Empty(t, cat.Site("passing").Missing)
	require.Empty(t, needs.SiteAssets("passing").GetUpstream())
	require.Zero(t, up.gets.Load())

	// a caching site's plan makes the controller fetch it once; the site is asked for it once held
	needs.SetMachine("cached", "m2", nil, w)
	needs.SetMachine("cached", "m3", nil, w)

	require.Eventually(t, func() bool {
		missing := cat.Site("cached").Missing

		return len(missing) == 1 && missing[0].GetSha256() == sum
	}, 10*time.Second, 5*time.Millisecond)
	require.Empty(t, needs.SiteAssets("cached").GetUpstream(), "nothing pending once held")
	require.EqualValues(t, 1, up.gets.Load())
	require.Equal(t, []string{srv.URL + "/k"}, cat.Site("cached").Missing[0].GetUrls(), "the edge may fetch it upstream itself")

	// a failing upstream shows as pending with its error
	bad := assets.Want{Name: "talos/v1.11.0/s/amd64/initramfs.xz", URL: srv.URL + "/missing"}
	needs.SetMachine("cached", "m4", nil, bad)

	require.Eventually(t, func() bool {
		ups := needs.SiteAssets("cached").GetUpstream()

		return len(ups) == 1 && ups[0].GetKey() == bad.Name && strings.Contains(ups[0].GetError(), "404")
	}, 10*time.Second, 5*time.Millisecond)
}

func TestOfflineSitesGetOnlyWhatWasStaged(t *testing.T) {
	t.Parallel()

	up, srv := serveUpstream(t)
	kernel, sum := randomBytes(t, 5000)
	up.set("/k", kernel, 0)

	lib := startLibrary(t, assets.DefaultLibrary(t.TempDir(), srv.Client()))
	cat := assets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil)
	needs := assets.NewNeeds(cat, lib, nil)

	runNeeds(t, needs)

	w := assets.Want{Name: "talos/v1.11.0/s/amd64/kernel", URL: srv.URL + "/k"}

	needs.SetMachine("far", "m1", nil, w)
	require.Empty(t, cat.Site("far").Missing, "nothing reaches an offline site unasked")

	ups := needs.SiteAssets("far").GetUpstream()
	require.Len(t, ups, 1)
	require.Equal(t, w.Name, ups[0].GetKey())
	require.Contains(t, ups[0].GetError(), "not staged")
	require.Zero(t, up.gets.Load())

	needs.SetStaged("far", nil, []assets.Want{w})

	require.Eventually(t, func() bool {
		missing := cat.Site("far").Missing

		return len(missing) == 1 && missing[0].GetSha256() == sum
	}, 10*time.Second, 5*time.Millisecond)
	require.Empty(t, needs.SiteAssets("far").GetUpstream())
	require.EqualValues(t, 1, up.gets.Load())
}

// runNeeds runs the needs' library loop until the test ends.
func runNeeds(t *testing.T, needs *assets.Needs) {
	t.Helper()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- needs.RunLibrary(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}
