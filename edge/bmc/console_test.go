package bmc_test

import (
	"bytes"
	"strings"
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

func TestOperatorName(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct{ name, in, want string }{
		{name: "plain", in: "alice@noc-1.example", want: "alice@noc-1.example"},
		{name: "empty", in: "", want: "unknown"},
		{name: "terminal codes", in: "eve\x1b]0;owned\x07", want: "eve__0_owned_"},
		{name: "long", in: strings.Repeat("a", 100), want: strings.Repeat("a", 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, bmc.OperatorName(tc.in))
		})
	}
}

// FuzzOperatorName: whatever an operator calls itself, the edge repeats at most 64 harmless bytes.
func FuzzOperatorName(f *testing.F) {
	f.Add("alice@noc")
	f.Add("\x1b[2J\xff")

	f.Fuzz(func(t *testing.T, in string) {
		got := bmc.OperatorName(in)
		if len(got) == 0 || len(got) > 64 || strings.Trim(got, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@._-") != "" {
			t.Fatalf("operator name %q from %q", got, in)
		}
	})
}
