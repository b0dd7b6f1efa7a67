package envflag_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/envflag"
)

func TestEnv(t *testing.T) {
	t.Parallel()

	env := envflag.NewFrom(map[string]string{
		"S": "x", "D": "90s", "B": "true", "BAD_D": "soon", "BAD_B": "perhaps", "I": "64", "BAD_I": "many",
	})

	require.Equal(t, "x", env.String("S", "d"))
	require.Equal(t, "d", env.String("UNSET", "d"))
	require.Equal(t, 90*time.Second, env.Duration("D", time.Second))
	require.True(t, env.Bool("B", false))
	require.Equal(t, 64, env.Int("I", 1))
	require.Equal(t, 1, env.Int("UNSET", 1))
	require.NoError(t, env.Err())

	require.Equal(t, time.Second, env.Duration("BAD_D", time.Second))
	require.False(t, env.Bool("BAD_B", false))
	require.ErrorContains(t, env.Err(), `BAD_D="soon" is not a duration`)
	require.Equal(t, 1, env.Int("BAD_I", 1))
	require.ErrorContains(t, env.Err(), `BAD_B="perhaps" is not a boolean`)
	require.ErrorContains(t, env.Err(), `BAD_I="many" is not an integer`)
}
