package bootlab_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// TestCPIOWriterReadByCpio checks the archive with Debian's cpio when it is installed.
func TestCPIOWriterReadByCpio(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed: cannot cross-check the archive")
	}

	var buf bytes.Buffer

	c := bootlab.NewCPIOWriter(&buf)
	c.Dir("dev")
	c.CharDev("dev/console", 5, 1)
	c.File("init", 0o755, []byte("#!/bin/sh\n"))
	c.File("odd", 0o644, []byte("abc"))
	require.NoError(t, c.Close())

	cmd := exec.Command("cpio", "-t", "-v")
	cmd.Stdin = &buf

	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))

	listing := string(out)
	for _, want := range []string{"dev", "dev/console", "init", "odd"} {
		require.Contains(t, listing, want)
	}

	require.True(t, strings.Contains(listing, "crw-------") && strings.Contains(listing, "5,"), listing)
}

func TestModuleDepsOfTheGuestKernel(t *testing.T) {
	t.Parallel()

	k, err := bootlab.EnsureKernel(filepath.Join(bootlab.RepoRoot(t), "_out", "bootlab"))
	if err != nil {
		t.Skipf("guest kernel not available: %v", err)
	}

	order, err := bootlab.ModuleDeps(k.ModulesDir, []string{"virtio_pci", "virtio_net"})
	require.NoError(t, err)

	index := map[string]int{}
	for i, m := range order {
		index[filepath.Base(m)] = i
	}

	require.Contains(t, index, "virtio_net.ko")
	require.Contains(t, index, "failover.ko")
	require.Less(t, index["virtio.ko"], index["virtio_pci.ko"], "dependencies first")
	require.Less(t, index["net_failover.ko"], index["virtio_net.ko"])
}
