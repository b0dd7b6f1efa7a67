package bmc_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc"
)

// TestConsoleFloodIsBounded: a BMC flooding a session whose reader does not collect costs at most 256 frames of
// 1 KiB; the rest is dropped and counted (the reader is told how much), and writing never blocks the SOL stream.
func TestConsoleFloodIsBounded(t *testing.T) {
	t.Parallel()

	q := bmc.NewConsoleQueue()

	const total = 16 << 20

	chunk := bytes.Repeat([]byte("f"), 4096)
	for written := 0; written < total; written += len(chunk) {
		n, err := q.Writer().Write(chunk)
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}

	queued, dropped := q.Drain()
	require.Equal(t, 256<<10, queued, "at most 256 KiB held")
	require.Equal(t, int64(total-256<<10), dropped)

	// Once drained, output flows again and nothing more is reported dropped.
	_, err := q.Writer().Write([]byte("after"))
	require.NoError(t, err)

	queued, dropped = q.Drain()
	require.Equal(t, 5, queued)
	require.Zero(t, dropped)
}
