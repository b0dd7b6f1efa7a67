package seal_test

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/seal"
)

func serviceAccountKey(t *testing.T) string {
	t.Helper()

	key, err := pgp.GenerateKey("bare-metal", "", "bare-metal@infra-provider.serviceaccount.omni.sidero.dev", time.Hour)
	require.NoError(t, err)

	enc, err := serviceaccount.Encode("bare-metal@infra-provider.serviceaccount.omni.sidero.dev", key)
	require.NoError(t, err)

	return enc
}

func TestSealOpen(t *testing.T) {
	t.Parallel()

	sa := serviceAccountKey(t)

	k1, err := seal.KeyFromServiceAccount(sa, "bmc")
	require.NoError(t, err)
	k2, err := seal.KeyFromServiceAccount(" "+sa+"\n", "bmc")
	require.NoError(t, err)
	require.Equal(t, k1, k2, "the same key, as given by another controller")

	other, err := seal.KeyFromServiceAccount(sa, "other purpose")
	require.NoError(t, err)
	require.NotEqual(t, k1, other)

	box, err := seal.New(k1, rand.Reader)
	require.NoError(t, err)

	const password = "x" // one character: the sealed form must not show it

	sealed, err := box.Seal(password)
	require.NoError(t, err)
	require.True(t, seal.Sealed(sealed))
	require.NotContains(t, strings.TrimPrefix(sealed, seal.Prefix), password+password)

	again, err := box.Seal(password)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce each time")

	got, err := box.Open(sealed)
	require.NoError(t, err)
	require.Equal(t, password, got)

	clear, err := box.Open("written-before-sealing")
	require.NoError(t, err)
	require.Equal(t, "written-before-sealing", clear, "a clear value passes, to be resealed")

	// another provider key (a new key, or an attacker's) cannot open it
	stranger, err := seal.KeyFromServiceAccount(serviceAccountKey(t), "bmc")
	require.NoError(t, err)
	strangerBox, err := seal.New(stranger, rand.Reader)
	require.NoError(t, err)

	_, err = strangerBox.Open(sealed)
	require.ErrorIs(t, err, seal.ErrOpen)

	for _, bad := range []string{seal.Prefix, seal.Prefix + "!!!", seal.Prefix + "AAAA", sealed[:len(sealed)-2]} {
		_, err = box.Open(bad)
		require.ErrorIs(t, err, seal.ErrOpen, bad)
	}

	_, err = seal.KeyFromServiceAccount("not a key", "bmc")
	require.Error(t, err)
}

func FuzzOpen(f *testing.F) {
	box, err := seal.New(make([]byte, 32), rand.Reader)
	require.NoError(f, err)

	sealed, err := box.Seal("secret")
	require.NoError(f, err)

	f.Add(sealed)
	f.Add(seal.Prefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("plain")

	f.Fuzz(func(t *testing.T, v string) {
		out, err := box.Open(v)
		if !seal.Sealed(v) {
			require.NoError(t, err)
			require.Equal(t, v, out)
		}
	})
}
