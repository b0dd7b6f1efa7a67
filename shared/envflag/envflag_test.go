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
		"S": "x", "D": "90s", "B": "true", "L": "a,b", "BAD_D": "soon", "BAD_B": "perhaps",
	})

	require.Equal(t, "x", env.String("S", "d"))
	require.Equal(t, "d", env.String("UNSET", "d"))
	require.Equal(t, 90*time.Second, env.Duration("D", time.Second))
	require.True(t, env.Bool("B", false))
	require.Equal(t, []string{"a", "b"}, env.List("L", nil))
	require.NoError(t, env.Err())

	require.Equal(t, time.Second, env.Duration("BAD_D", time.Second))
	require.False(t, env.Bool("BAD_B", false))
	require.ErrorContains(t, env.Err(), `BAD_D="soon" is not a duration`)
	require.ErrorContains(t, env.Err(), `BAD_B="perhaps" is not a boolean`)
}
