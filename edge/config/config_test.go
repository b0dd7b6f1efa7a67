package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/config"
)

func TestJoinTokenFromFile(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(file, []byte("outpost1.site.secret.pin\n"), 0o600))

	cfg := config.Default()
	cfg.JoinTokenFile = file
	require.NoError(t, cfg.LoadJoinToken())
	require.Equal(t, "outpost1.site.secret.pin", cfg.Uplink.JoinToken)

	both := config.Default()
	both.JoinTokenFile, both.Uplink.JoinToken = file, "outpost1.other"
	require.ErrorContains(t, both.LoadJoinToken(), "give one")

	missing := config.Default()
	missing.JoinTokenFile = filepath.Join(dir, "absent")
	require.ErrorContains(t, missing.LoadJoinToken(), "join token file")
}
