package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/config"
)

// Relative path settings are made absolute, so `--state-dir c1` works for the admin commands too (a relative
// unix socket path used to read as a URL authority: "invalid (non-empty) authority: c1").
func TestAbsolutePaths(t *testing.T) {
	t.Parallel()

	wd, err := os.Getwd()
	require.NoError(t, err)

	cfg := config.Default()
	cfg.StateDir, cfg.InstallAssetsDir, cfg.TrustedRootsFile = "c1", "../assets", "/etc/roots.pem"

	require.NoError(t, cfg.AbsolutePaths())
	require.Equal(t, filepath.Join(wd, "c1"), cfg.StateDir)
	require.Equal(t, filepath.Join(filepath.Dir(wd), "assets"), cfg.InstallAssetsDir)
	require.Equal(t, "/etc/roots.pem", cfg.TrustedRootsFile)
	require.Equal(t, filepath.Join(wd, "c1", "admin.sock"), cfg.AdminSocketPath())
	require.Empty(t, cfg.AgentAssetsDir, "unset stays unset")
}
