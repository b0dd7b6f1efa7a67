package tunnel_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/tunnel"
)

// The boot evidence outlives an edge restart: a machine that booted through the edge binds its agent's tunnel
// to the restarted edge; a file that is not evidence is set aside and the book starts empty.
func TestBootEvidenceOutlivesARestart(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	log := zaptest.NewLogger(t)

	book, err := tunnel.LoadBootBook(dir, time.Now, log)
	require.NoError(t, err)

	_, ok := book.BootAddr("5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c11")
	require.False(t, ok, "no file: no evidence")

	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	book.Note("5A3E0F1E-8C1B-4BDE-9C53-3F2E1A0B7C11", netip.MustParseAddr("10.0.0.7"), mac)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- book.Run(ctx) }()

	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, tunnel.BootBookFile))

		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "the evidence was not written within seconds")

	cancel()
	require.NoError(t, <-done)

	restarted, err := tunnel.LoadBootBook(dir, time.Now, log)
	require.NoError(t, err)

	addr, ok := restarted.BootAddr("5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c11")
	require.True(t, ok)
	require.Equal(t, netip.MustParseAddr("10.0.0.7"), addr)

	// Not evidence: set aside, an empty book.
	require.NoError(t, os.WriteFile(filepath.Join(dir, tunnel.BootBookFile), []byte("{not json"), 0o600))

	broken, err := tunnel.LoadBootBook(dir, time.Now, log)
	require.NoError(t, err)

	_, ok = broken.BootAddr("5a3e0f1e-8c1b-4bde-9c53-3f2e1a0b7c11")
	require.False(t, ok)
	require.FileExists(t, filepath.Join(dir, tunnel.BootBookFile+".bad"))
}
