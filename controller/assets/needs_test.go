package assets_test

import (
	"testing"

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
	needs := assets.NewNeeds(cat, agent)

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
