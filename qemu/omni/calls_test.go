package omni_test

import (
	"testing"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/omni"
)

// TestCallCounter counts State calls by identity and method; Provision is not a State call.
func TestCallCounter(t *testing.T) {
	t.Parallel()

	cfg := omni.Default()
	cfg.Calls = omni.NewCallCounter()
	s := startStandIn(t, cfg)

	provider := s.client(t, s.ProviderKey())
	admin := s.client(t, s.AdminKey())

	_, err := safe.StateListAll[*infra.Machine](t.Context(), provider)
	require.NoError(t, err)

	_, err = safe.StateGetByID[*infra.ProviderStatus](t.Context(), provider, "bare-metal")
	require.Error(t, err) // not found: still a call

	_, err = safe.StateListAll[*infra.Machine](t.Context(), admin)
	require.NoError(t, err)

	_, err = s.provision(t, t.Context(), "00000000-0000-4000-8000-00000000c0de")
	require.NoError(t, err)

	got := cfg.Calls.Snapshot()
	require.Equal(t, uint64(1), got[omni.CallKey{Identity: omni.ProviderIdentity("bare-metal"), Method: "List"}])
	require.Equal(t, uint64(1), got[omni.CallKey{Identity: omni.ProviderIdentity("bare-metal"), Method: "Get"}])
	require.Equal(t, uint64(1), got[omni.CallKey{Identity: omni.AdminIdentity, Method: "List"}])
	require.Len(t, got, 3, "only State calls are counted: %v", got)
}
