package assetcache_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

func TestService(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<30)
	f, err := assetcache.NewFetcher(assetcache.DefaultFetcher(), s, nil, zaptest.NewLogger(t))
	require.NoError(t, err)

	svc := assetcache.NewService(f)

	a, aSum := blob(t, 100)
	b, bSum := blob(t, 200)
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/kernel", SHA256: aSum, Size: 100}, &bytesSource{data: a}))
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: bSum, Size: 200}, &bytesSource{data: b}))

	s.Hold(aSum)

	list, err := svc.List(t.Context(), &assetsapi.ListRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetAssets(), 2)
	require.Equal(t, int64(300), list.GetBytesUsed())

	ev, err := svc.Evict(t.Context(), &assetsapi.EvictRequest{Sha256: []string{aSum, bSum, "../x"}})
	require.NoError(t, err)
	require.Equal(t, []string{bSum}, ev.GetEvicted())
	require.Contains(t, ev.GetRefused()[aSum], "needed by a current boot plan")
	require.Contains(t, ev.GetRefused(), "../x")

	ens, err := svc.Ensure(t.Context(), &assetsapi.EnsureRequest{
		Policy: assetsapi.Policy_POLICY_OFFLINE,
		Assets: []*assetsapi.AssetRef{{Name: "agent/amd64/kernel", Sha256: aSum, Size: 100}, {Name: "agent/amd64/initramfs", Sha256: bSum, Size: 200}},
	})
	require.NoError(t, err)
	require.Equal(t, assetsapi.AssetState_ASSET_STATE_PRESENT, ens.GetStatuses()[0].GetState())
	require.Equal(t, assetsapi.AssetState_ASSET_STATE_MISSING, ens.GetStatuses()[1].GetState())

	_, err = svc.Ensure(t.Context(), &assetsapi.EnsureRequest{Policy: assetsapi.Policy_POLICY_CACHE, Assets: []*assetsapi.AssetRef{{Name: "../../etc", Sha256: aSum, Size: 1}}})
	require.Error(t, err)

	_, err = svc.Ensure(t.Context(), &assetsapi.EnsureRequest{})
	require.Error(t, err)
}
