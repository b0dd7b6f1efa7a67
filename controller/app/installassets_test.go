package app

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/config"
)

// Every network-booting plan (install and agent mode) names the local files its site must hold, by digest,
// copied into the relay directory; plans that boot nothing from the edge name none.
func TestInstallFilesRefs(t *testing.T) {
	t.Parallel()

	dir, relay := t.TempDir(), t.TempDir()
	sub := filepath.Join(dir, "abc", "v1.11.0")
	require.NoError(t, os.MkdirAll(sub, 0o755))

	kernel, initrd := []byte("a kernel"), []byte("an initramfs")
	require.NoError(t, os.WriteFile(filepath.Join(sub, "kernel-amd64"), kernel, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(sub, "initramfs-amd64.xz"), initrd, 0o644))

	cfg := config.Default()
	cfg.InstallAssetsDir = dir
	f := newInstallFiles(cfg, relay)

	digest := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

	for _, mode := range []bootplans.Mode{bootplans.ModeInstall, bootplans.ModeAgent} {
		refs, err := f.refs(bootplans.Plan{
			MachineID: "m1", Mode: mode,
			KernelURL: "/assets/install/abc/v1.11.0/kernel-amd64", InitrdURL: "/assets/install/abc/v1.11.0/initramfs-amd64.xz",
		})
		require.NoError(t, err)
		require.Len(t, refs, 2, mode)
		require.Equal(t, "install/abc/v1.11.0/kernel-amd64", refs[0].GetName())
		require.Equal(t, digest(kernel), refs[0].GetSha256())
		require.EqualValues(t, len(initrd), refs[1].GetSize())
		require.FileExists(t, filepath.Join(relay, digest(initrd)))
	}

	for _, plan := range []bootplans.Plan{
		{MachineID: "m1", Mode: bootplans.ModeDisk},
		{MachineID: "m1", Mode: bootplans.ModeAgent}, // the edge's own agent image
		{MachineID: "m1", Mode: bootplans.ModeInstall, KernelURL: "https://factory.invalid/k", InitrdURL: "https://factory.invalid/i"},
	} {
		refs, err := f.refs(plan)
		require.NoError(t, err)
		require.Empty(t, refs)
	}

	_, err := f.refs(bootplans.Plan{MachineID: "m1", Mode: bootplans.ModeInstall, KernelURL: "/assets/install/abc/v1.11.0/missing"})
	require.ErrorContains(t, err, "install asset abc/v1.11.0/missing of m1")
}
