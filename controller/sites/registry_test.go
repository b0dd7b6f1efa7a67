package sites_test

import (
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/sites"
)

func newRegistry(t *testing.T, now func() time.Time) *sites.Registry {
	t.Helper()
	require.NoError(t, resources.Register())

	ca, _, _, err := sites.NewCA(time.Now())
	require.NoError(t, err)

	return sites.NewRegistry(state.WrapCore(namespaced.NewState(inmem.Build)), ca, rand.Reader, now)
}

func TestSingleUseTokenRace(t *testing.T) {
	t.Parallel()

	reg := newRegistry(t, time.Now)
	tok, _, err := reg.Create(t.Context(), "race", "", sites.TokenOptions{})
	require.NoError(t, err)

	const racers = 16

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)

	for range racers {
		wg.Go(func() {
			if reg.ConsumeToken(t.Context(), tok) == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}

	wg.Wait()
	require.Equal(t, 1, wins, "a single-use token must enrol exactly one edge")
}

func TestReusableTokenAndStoredHashOnly(t *testing.T) {
	t.Parallel()

	reg := newRegistry(t, time.Now)
	tok, _, err := reg.Create(t.Context(), "fleet", "many edges", sites.TokenOptions{Reusable: true})
	require.NoError(t, err)

	for range 3 {
		require.NoError(t, reg.ConsumeToken(t.Context(), tok))
	}

	site, err := reg.Get(t.Context(), "fleet")
	require.NoError(t, err)
	require.Equal(t, tok.SecretHash(), site.TypedSpec().Value.GetTokenHash())
	require.NotContains(t, string(site.TypedSpec().Value.GetTokenHash()), string(tok.Secret))

	_, _, err = reg.Create(t.Context(), "fleet", "", sites.TokenOptions{})
	require.ErrorIs(t, err, sites.ErrSiteExists)
}

func TestOnlyTheNewestTwoCertificatesAreValid(t *testing.T) {
	t.Parallel()

	reg := newRegistry(t, time.Now)
	_, _, err := reg.Create(t.Context(), "certs", "", sites.TokenOptions{})
	require.NoError(t, err)

	for _, serial := range []string{"1", "2", "3"} {
		require.NoError(t, reg.AddCertificate(t.Context(), "certs", serial))
	}

	require.Error(t, reg.Authorize(t.Context(), "certs", "1"))
	require.NoError(t, reg.Authorize(t.Context(), "certs", "2"))
	require.NoError(t, reg.Authorize(t.Context(), "certs", "3"))

	require.NoError(t, reg.Revoke(t.Context(), "certs"))
	require.ErrorIs(t, reg.Authorize(t.Context(), "certs", "3"), sites.ErrRevoked)
	require.ErrorIs(t, reg.AddCertificate(t.Context(), "certs", "4"), sites.ErrRevoked)

	require.NoError(t, reg.Delete(t.Context(), "certs"))
	require.ErrorIs(t, reg.Authorize(t.Context(), "certs", "3"), sites.ErrUnknownSite)
}
