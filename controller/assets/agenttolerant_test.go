package assets_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
)

type refusingResolver struct{}

func (refusingResolver) Resolve(_ context.Context, p assets.Profile) (assets.Boot, error) {
	return assets.Boot{}, fmt.Errorf("talos %s: %w", p.TalosVersion, assets.ErrNotAvailable)
}

// Only the agent's own Talos version is let through without assets (edges boot it from their own); any other
// profile keeps its error.
func TestTolerateMissingAgent(t *testing.T) {
	t.Parallel()

	r := assets.TolerateMissingAgent(refusingResolver{}, "v1.11.5")

	boot, err := r.Resolve(t.Context(), assets.Profile{TalosVersion: "1.11.5", KernelArgs: []string{"console=ttyS0"}})
	require.NoError(t, err, "the agent's version, written without the v")
	require.Equal(t, assets.Boot{KernelArgs: []string{"console=ttyS0"}}, boot)

	_, err = r.Resolve(t.Context(), assets.Profile{TalosVersion: "v1.10.0"})
	require.ErrorIs(t, err, assets.ErrNotAvailable)
}
