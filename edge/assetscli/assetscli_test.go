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

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/assetscli"
)

func bundle(t *testing.T, pathInManifest string) (string, string) {
	t.Helper()

	dir := t.TempDir()
	data := []byte("kernel bytes")
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])

	require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), data, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, assetcache.BundleManifestName), fmt.Appendf(nil,
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
			cfg := assetcache.Default()
			cfg.Dir = t.TempDir()

			cmd := assetscli.NewCommand(func() (assetcache.Config, error) { return cfg, nil }, func() *zap.Logger { return zaptest.NewLogger(t) })

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

			s, err := assetcache.New(cfg, zaptest.NewLogger(t), nil)
			require.NoError(t, err)
			require.True(t, s.Has(digest))
		})
	}
}

// A bundle made by `edge assets bundle` imports: every name with the bytes of its file (one file under two
// names stored once, a tree under its prefix); bad input writes no manifest.
func TestBundleThenImport(t *testing.T) {
	t.Parallel()

	src := t.TempDir()
	kernel, initrd := filepath.Join(src, "vmlinuz"), filepath.Join(src, "initramfs.xz")
	require.NoError(t, os.WriteFile(kernel, []byte("kernel bytes"), 0o644))
	require.NoError(t, os.WriteFile(initrd, []byte("initramfs bytes"), 0o644))

	tree := filepath.Join(src, "install")
	require.NoError(t, os.MkdirAll(filepath.Join(tree, "abc123", "v1.11.5"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tree, "abc123", "v1.11.5", "vmlinuz"), []byte("install kernel"), 0o644))

	run := func(args ...string) (string, error) {
		cfg := assetcache.Default()
		cfg.Dir = filepath.Join(t.TempDir(), "cache")

		cmd := assetscli.NewCommand(func() (assetcache.Config, error) { return cfg, nil }, func() *zap.Logger { return zaptest.NewLogger(t) })

		var out bytes.Buffer

		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)

		err := cmd.Execute()

		return out.String(), err
	}

	dir := filepath.Join(t.TempDir(), "bundle")
	out, err := run("bundle", dir, "agent/x86_64/vmlinuz="+kernel, "agent/amd64/vmlinuz="+kernel, "agent/x86_64/initramfs.xz="+initrd,
		"--tree", "install="+tree)
	require.NoError(t, err, out)
	require.Contains(t, out, "4 assets")

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 4, "three files, the kernel once, and the manifest")

	out, err = run("import", dir)
	require.NoError(t, err, out)
	require.Contains(t, out, "4 assets imported")
	require.Contains(t, out, "imported install/abc123/v1.11.5/vmlinuz")

	// Bad input: a name the import would refuse, a missing file, a pair without a name; nothing is written.
	for _, args := range [][]string{
		{"bundle", filepath.Join(t.TempDir(), "b"), "../escape=" + kernel},
		{"bundle", filepath.Join(t.TempDir(), "b"), "agent/x86_64/vmlinuz=" + filepath.Join(src, "missing")},
		{"bundle", filepath.Join(t.TempDir(), "b"), kernel},
		{"bundle", dir, "agent/arm64/vmlinuz=" + kernel},
	} {
		out, err := run(args...)
		require.Error(t, err, "%v: %s", args, out)

		if args[1] != dir {
			require.NoFileExists(t, filepath.Join(args[1], assetcache.BundleManifestName), "%v", args)
		}
	}
}
