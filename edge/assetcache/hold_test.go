package assetcache_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
)

// What the controller asked a fetcher to hold is never evicted from its store.
func TestFetcherHoldsWhatItWasAskedFor(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<20)

	held, heldSum := blob(t, 1000)
	other, otherSum := blob(t, 1000)

	for _, b := range []struct {
		data []byte
		ref  assetcache.Ref
	}{
		{held, assetcache.Ref{Name: "a/held", SHA256: heldSum, Size: 1000}},
		{other, assetcache.Ref{Name: "a/other", SHA256: otherSum, Size: 1000}},
	} {
		require.NoError(t, s.Put(t.Context(), b.ref, &bytesSource{data: b.data}))
	}

	f, err := assetcache.NewFetcher(assetcache.DefaultFetcher(), s, nil, zaptest.NewLogger(t))
	require.NoError(t, err)

	_, err = f.Ensure(assetcache.PolicyCache, []assetcache.Ref{{Name: "a/held", SHA256: heldSum, Size: 1000}})
	require.NoError(t, err)

	evicted, refused, err := s.Evict(heldSum, otherSum)
	require.NoError(t, err)
	require.Equal(t, []string{otherSum}, evicted)
	require.ErrorIs(t, refused[heldSum], assetcache.ErrNeeded)
}
