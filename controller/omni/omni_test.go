package omni_test

import (
	"testing"
	"time"

	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/omni"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()

	key, err := pgp.GenerateKey("bare-metal@infra-provider.serviceaccount.omni.sidero.dev", "", "bare-metal@infra-provider.serviceaccount.omni.sidero.dev", time.Hour)
	require.NoError(t, err)

	enc, err := serviceaccount.Encode("bare-metal@infra-provider.serviceaccount.omni.sidero.dev", key)
	require.NoError(t, err)

	good := omni.Default()
	good.Endpoint = "https://omni.example"
	good.ServiceAccountKey = enc

	require.NoError(t, good.Validate())

	for _, tc := range []struct {
		name string
		mod  func(*omni.Config)
		is   error
	}{
		{name: "no endpoint", mod: func(c *omni.Config) { c.Endpoint = "" }},
		{name: "bad scheme", mod: func(c *omni.Config) { c.Endpoint = "ftp://omni" }},
		{name: "no key", mod: func(c *omni.Config) { c.ServiceAccountKey = "" }},
		{name: "garbage key", is: omni.ErrBadKey, mod: func(c *omni.Config) { c.ServiceAccountKey = "!!!" }},
		{name: "no provider id", mod: func(c *omni.Config) { c.ProviderID = "" }},
		{name: "key of another provider", is: omni.ErrWrongProviderID, mod: func(c *omni.Config) { c.ProviderID = "other" }},
		{name: "bad backoff", mod: func(c *omni.Config) { c.RetryMax = c.RetryMin / 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			c := good
			tc.mod(&c)

			err := c.Validate()
			require.Error(t, err)

			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
		})
	}
}
