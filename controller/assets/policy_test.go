package assets_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// The policy flag holds the parsed policy, shows it by name and refuses a name that is not a policy.
func TestPolicyFlag(t *testing.T) {
	t.Parallel()

	p := assetsapi.Policy_POLICY_CACHE
	f := pflag.NewFlagSet("test", pflag.ContinueOnError)
	f.Var(assets.PolicyFlag(&p), "policy", "")

	require.Equal(t, "cache", f.Lookup("policy").DefValue)
	require.NoError(t, f.Parse([]string{"--policy", "Offline"}))
	require.Equal(t, assetsapi.Policy_POLICY_OFFLINE, p)
	require.Equal(t, "offline", f.Lookup("policy").Value.String())

	require.ErrorContains(t, f.Parse([]string{"--policy", "sometimes"}), "want passthrough, cache or offline")
	require.Equal(t, assetsapi.Policy_POLICY_OFFLINE, p, "a refused value changes nothing")

	require.True(t, assets.ValidPolicy(assetsapi.Policy_POLICY_PASSTHROUGH))
	require.False(t, assets.ValidPolicy(assetsapi.Policy_POLICY_UNSPECIFIED))
}
