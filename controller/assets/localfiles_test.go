package assets_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
)

func digestOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// Local install files named by edge-relative URLs become references by digest, copied into the relay
// directory; URLs elsewhere name none, and a missing file is an error naming the machine.
func TestInstallFilesRefs(t *testing.T) {
	t.Parallel()

	dir, relay := t.TempDir(), t.TempDir()
	sub := filepath.Join(dir, "abc", "v1.11.0")
	require.NoError(t, os.MkdirAll(sub, 0o755))

	kernel, initrd := []byte("a kernel"), []byte("an initramfs")
	require.NoError(t, os.WriteFile(filepath.Join(sub, "kernel-amd64"), kernel, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(sub, "initramfs-amd64.xz"), initrd, 0o644))

	f := assets.NewInstallFiles(dir, "/assets/install", relay)

	refs, err := f.Refs("m1", "/assets/install/abc/v1.11.0/kernel-amd64", "/assets/install/abc/v1.11.0/initramfs-amd64.xz")
	require.NoError(t, err)
	require.Len(t, refs, 2)
	require.Equal(t, "install/abc/v1.11.0/kernel-amd64", refs[0].GetName())
	require.Equal(t, digestOf(kernel), refs[0].GetSha256())
	require.EqualValues(t, len(initrd), refs[1].GetSize())
	require.FileExists(t, filepath.Join(relay, digestOf(initrd)))

	refs, err = f.Refs("m1", "https://factory.invalid/k", "", "/assets/install/")
	require.NoError(t, err)
	require.Empty(t, refs)

	_, err = f.Refs("m1", "/assets/install/abc/v1.11.0/missing")
	require.ErrorContains(t, err, "install asset abc/v1.11.0/missing of m1")

	none := assets.NewInstallFiles(dir, "https://assets.invalid/install", relay)
	refs, err = none.Refs("m1", "/assets/install/abc/v1.11.0/kernel-amd64")
	require.NoError(t, err)
	require.Empty(t, refs, "assets served elsewhere are nothing for edges to hold")
}

func TestLoadAgentImages(t *testing.T) {
	t.Parallel()

	dir, relay := t.TempDir(), t.TempDir()

	_, err := assets.LoadAgentImages(dir, relay)
	require.ErrorContains(t, err, "no <arch>/vmlinuz or <arch>/initramfs.xz in "+dir)

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "x86_64"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "riscv"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x86_64", "vmlinuz"), []byte("k"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x86_64", "initramfs.xz"), []byte("i"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "riscv", "vmlinuz"), []byte("r"), 0o644))

	refs, err := assets.LoadAgentImages(dir, relay)
	require.NoError(t, err)
	require.Len(t, refs, 2, "unknown architectures are skipped")
	require.Equal(t, "agent/x86_64/initramfs.xz", refs[0].GetName())
	require.Equal(t, "agent/x86_64/vmlinuz", refs[1].GetName())
	require.FileExists(t, filepath.Join(relay, digestOf([]byte("k"))))
}
