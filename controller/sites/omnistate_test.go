package sites_test

import (
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/seal"
	"github.com/outpost-metal/outpost/controller/sites"
)

// omniState is an in-process state with the provider's types registered, as Omni's is to the controller.
func omniState(t *testing.T) (state.State, resources.Types) {
	t.Helper()

	types := resources.NewTypes("outpost-test")
	require.NoError(t, types.Register())

	return state.WrapCore(namespaced.NewState(inmem.Build)), types
}

func newBox(t *testing.T) *seal.Box {
	t.Helper()

	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)

	box, err := seal.New(key, rand.Reader)
	require.NoError(t, err)

	return box
}

func TestSharedCA(t *testing.T) {
	t.Parallel()

	st, types := omniState(t)
	box := newBox(t)

	first, origin, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
	require.NoError(t, err)
	require.Equal(t, sites.CACreated, origin)

	// A second controller (another state directory, the same key) gets the same CA.
	second, origin, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
	require.NoError(t, err)
	require.Equal(t, sites.CAFromOmni, origin)
	require.Equal(t, first.Fingerprint(), second.Fingerprint())

	// The key is sealed in Omni: a reader of the namespace sees no private key.
	rec, err := safe.StateGet[*resources.EnrollmentCA](t.Context(), st, types.NewEnrollmentCA(resources.EnrollmentCAID).Metadata())
	require.NoError(t, err)
	require.True(t, seal.Sealed(rec.TypedSpec().Value.GetSealedKey()))
	require.NotContains(t, rec.TypedSpec().Value.GetSealedKey(), "PRIVATE KEY")

	// A controller with another key cannot sign with it, and says why; it does not replace it either.
	_, _, err = sites.LoadOrCreateSharedCA(t.Context(), st, types, newBox(t), t.TempDir(), time.Now())
	require.ErrorContains(t, err, "service-account key")

	third, _, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
	require.NoError(t, err)
	require.Equal(t, first.Fingerprint(), third.Fingerprint())
}

func TestSharedCAImportsTheStateDirectory(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	onDisk, err := sites.LoadOrCreateCA(dir, time.Now())
	require.NoError(t, err)

	st, types := omniState(t)

	ca, origin, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, newBox(t), dir, time.Now())
	require.NoError(t, err)
	require.Equal(t, sites.CAImported, origin)
	require.Equal(t, onDisk.Fingerprint(), ca.Fingerprint(), "tokens and certificates issued before keep working")
}

func TestSharedCARefusesWhatItCannotUse(t *testing.T) {
	t.Parallel()

	for name, mutate := range map[string]func(*resources.EnrollmentCA){
		"newer schema": func(r *resources.EnrollmentCA) { r.TypedSpec().Value.Schema = resources.EnrollmentCASchema + 1 },
		"key in the clear": func(r *resources.EnrollmentCA) {
			r.TypedSpec().Value.SealedKey = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
		},
		"damaged certificate": func(r *resources.EnrollmentCA) { r.TypedSpec().Value.CertificatePem = []byte("not a certificate") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			st, types := omniState(t)
			box := newBox(t)

			_, _, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
			require.NoError(t, err)

			md := types.NewEnrollmentCA(resources.EnrollmentCAID).Metadata()
			_, err = safe.StateUpdateWithConflicts(t.Context(), st, md, func(r *resources.EnrollmentCA) error {
				mutate(r)

				return nil
			})
			require.NoError(t, err)

			_, _, err = sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
			require.Error(t, err)

			// The record is left as it was: nothing overwrote it with a new CA.
			rec, err := safe.StateGet[*resources.EnrollmentCA](t.Context(), st, md)
			require.NoError(t, err)
			require.Equal(t, resources.EnrollmentCAID, rec.Metadata().ID())
		})
	}
}

func TestSharedCAControllersStartingAtOnceAgree(t *testing.T) {
	t.Parallel()

	st, types := omniState(t)
	box := newBox(t)

	const controllers = 8

	var (
		wg           sync.WaitGroup
		fingerprints [controllers]string
		errs         [controllers]error
	)

	for i := range controllers {
		wg.Go(func() {
			ca, _, err := sites.LoadOrCreateSharedCA(t.Context(), st, types, box, t.TempDir(), time.Now())
			errs[i] = err

			if err == nil {
				fingerprints[i] = string(ca.Certificate().Raw)
			}
		})
	}

	wg.Wait()

	for i := range controllers {
		require.NoError(t, errs[i])
		require.Equal(t, fingerprints[0], fingerprints[i], "controller %d has another CA", i)
	}
}

func TestImportSites(t *testing.T) {
	t.Parallel()

	require.NoError(t, resources.Register())

	ca, _, _, err := sites.NewCA(time.Now())
	require.NoError(t, err)

	local := sites.NewRegistry(state.WrapCore(namespaced.NewState(inmem.Build)), ca, rand.Reader, time.Now)
	st, types := omniState(t)
	inOmni := sites.NewRegistry(st, ca, rand.Reader, time.Now, sites.Kind(types.Sites()))

	tokA, _, err := local.Create(t.Context(), "site-a", "branch A", sites.TokenOptions{})
	require.NoError(t, err)
	_, _, err = local.Create(t.Context(), "site-b", "old description", sites.TokenOptions{})
	require.NoError(t, err)
	require.NoError(t, local.SetLabels(t.Context(), "site-a", map[string]string{"rack": "r1"}))
	_, _, err = inOmni.Create(t.Context(), "site-b", "kept in omni", sites.TokenOptions{})
	require.NoError(t, err)

	n, err := sites.ImportSites(t.Context(), local, inOmni, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// Idempotent: a second start imports nothing.
	n, err = sites.ImportSites(t.Context(), local, inOmni, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.Zero(t, n)

	list, err := inOmni.List(t.Context())
	require.NoError(t, err)
	require.Len(t, list, 2)

	for _, s := range list {
		require.Equal(t, types.Site, s.Metadata().Type())
		require.Equal(t, types.Namespace, s.Metadata().Namespace())
	}

	a, err := inOmni.Get(t.Context(), "site-a")
	require.NoError(t, err)
	require.Equal(t, "branch A", a.TypedSpec().Value.GetDescription())
	require.Equal(t, map[string]string{"rack": "r1"}, a.TypedSpec().Value.GetLabels())
	require.NoError(t, inOmni.CheckToken(t.Context(), tokA), "the join token made before the move still enrols")

	b, err := inOmni.Get(t.Context(), "site-b")
	require.NoError(t, err)
	require.Equal(t, "kept in omni", b.TypedSpec().Value.GetDescription(), "what Omni holds is the truth")
}
