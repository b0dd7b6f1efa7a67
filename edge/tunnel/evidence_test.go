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

// The book binds a machine to the address its latest boot script was served to; a config fetch (no MAC) is
// no evidence and refreshes none; two MACs asking for one machine's boot script within the window contest
// it, and the contest ends with the window.
func TestBootBook(t *testing.T) {
	t.Parallel()

	const id = "4C4C4544-0042-3510-8052-B4C04F4E4E51"

	c := &clock{t: time.Unix(1000, 0)}
	b := tunnel.NewBootBook(c.now)
	mac1, _ := net.ParseMAC("52:54:00:00:00:01") //nolint:errcheck
	mac2, _ := net.ParseMAC("52:54:00:00:00:02") //nolint:errcheck

	_, ok := b.BootAddr(id)
	require.False(t, ok)

	b.Note("{"+id+"}", netip.MustParseAddr("10.0.0.6"), nil) // a config fetch
	_, ok = b.BootAddr(id)
	require.False(t, ok, "a config fetch is no evidence")

	b.Note(id, netip.MustParseAddr("10.0.0.5"), mac1)
	b.Note("{"+id+"}", netip.MustParseAddr("10.0.0.6"), nil)

	addr, ok := b.BootAddr(id)
	require.True(t, ok)
	require.Equal(t, "10.0.0.5", addr.String(), "the boot script's address is the evidence; a config fetch changes nothing")
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

// Where the edge answers a MAC's DHCP or PXE requests, a boot script request naming that MAC is evidence only
// within BootWindow of the last answer: a request replayed from another host, with no boot behind it, is not.
func TestBootBookWantsTheBootTheEdgeAnswered(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f4e4e52"

	c := &clock{t: time.Unix(1000, 0)}
	b := tunnel.NewBootBook(c.now)
	mac, _ := net.ParseMAC("52:54:00:00:00:03") //nolint:errcheck

	b.DHCPAnswered(mac)
	c.advance(time.Minute)
	b.Note(id, netip.MustParseAddr("10.0.0.5"), mac)

	addr, ok := b.BootAddr(id)
	require.True(t, ok)
	require.Equal(t, "10.0.0.5", addr.String(), "the boot the edge answered")

	c.advance(tunnel.BootWindow)
	b.Note(id, netip.MustParseAddr("10.0.0.66"), mac)

	addr, _ = b.BootAddr(id)
	require.Equal(t, "10.0.0.5", addr.String(), "a boot script request long after the MAC's last DHCP is no boot")

	b.DHCPAnswered(mac)
	b.Note(id, netip.MustParseAddr("10.0.0.9"), mac)

	addr, _ = b.BootAddr(id)
	require.Equal(t, "10.0.0.9", addr.String(), "the machine's next boot")
}
