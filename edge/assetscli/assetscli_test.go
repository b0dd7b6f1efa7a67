package assetscli_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assets"
	"github.com/outpost-metal/outpost/edge/assetscli"
)

func bundle(t *testing.T, pathInManifest string) (string, string) {
	t.Helper()

	dir := t.TempDir()
	data := []byte("kernel bytes")
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])

	require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), data, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, assets.BundleManifestName), fmt.Appendf(nil,
		`{"version":1,"assets":[{"name":"agent/amd64/kernel","sha256":%q,"size":%d,"path":%q}]}`, digest, len(data), pathInManifest), 0o644))

	return dir, digest
}

func TestImportCommand(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		path    string
		wantErr string
	}{
		{name: "directory", path: "vmlinuz"},
		{name: "escaping path", path: "../vmlinuz", wantErr: "nothing was imported"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			src, digest := bundle(t, tt.path)
			cfg := assets.Default()
			cfg.Dir = t.TempDir()

			cmd := assetscli.NewCommand(func() (assets.Config, error) { return cfg, nil }, func() *zap.Logger { return zaptest.NewLogger(t) })

			var out bytes.Buffer

			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs([]string{"import", src})

			err := cmd.ExecuteContext(t.Context())
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)

				return
			}

			require.NoError(t, err)
			require.Contains(t, out.String(), "imported agent/amd64/kernel sha256:"+digest)

			s, err := assets.New(cfg, zaptest.NewLogger(t), nil, nil)
			require.NoError(t, err)
			require.True(t, s.Has(digest))
		})
	}
}
