package tunnel_test

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/tunnel"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// The book binds a machine to the address of its latest boot-script or config fetch; two MACs asking for one
// machine's boot script within the window contest it, and the contest ends with the window.
func TestBootBook(t *testing.T) {
	t.Parallel()

	const id = "4C4C4544-0042-3510-8052-B4C04F4E4E51"

	c := &clock{t: time.Unix(1000, 0)}
	b := tunnel.NewBootBook(c.now)
	mac1, _ := net.ParseMAC("52:54:00:00:00:01") //nolint:errcheck
	mac2, _ := net.ParseMAC("52:54:00:00:00:02") //nolint:errcheck

	_, ok := b.BootAddr(id)
	require.False(t, ok)

	b.Note(id, netip.MustParseAddr("10.0.0.5"), mac1)
	b.Note("{"+id+"}", netip.MustParseAddr("10.0.0.6"), nil) // the booted system's config fetch

	addr, ok := b.BootAddr(id)
	require.True(t, ok)
	require.Equal(t, "10.0.0.6", addr.String(), "the latest fetch is the evidence")
	require.False(t, b.Contested(id))

	b.Note(id, netip.MustParseAddr("10.0.0.7"), mac2)
	require.True(t, b.Contested(id), "two MACs asked for one machine's boot script")

	c.advance(tunnel.ContestWindow + time.Minute)
	require.False(t, b.Contested(id), "the contest ends with the window")

	b.Note("", netip.MustParseAddr("10.0.0.8"), mac1)
	b.Note(id, netip.Addr{}, mac1)
	addr, _ = b.BootAddr(id)
	require.Equal(t, "10.0.0.7", addr.String(), "fetches naming no machine or address are not evidence")
}
