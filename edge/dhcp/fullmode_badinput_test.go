//go:build linux

package dhcp_test

import (
	"crypto/rand"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// wireClient sends DHCP requests from the clients' bridge as many clients at once (insomniacslk's packets, one
// socket on port 68) and reads the edge's broadcast replies.
type wireClient struct {
	conn net.PacketConn
}

func needRoot(t *testing.T) {
	t.Helper()

	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and a veth pair")
	}

	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (Debian iproute2)")
	}
}

// newWireClient opens the socket on a thread inside the clients' namespace.
func (s *segment) newWireClient(t *testing.T) *wireClient {
	t.Helper()

	h, err := netns.GetFromName(s.clientNS)
	require.NoError(t, err)

	defer h.Close() //nolint:errcheck

	errc := make(chan error, 1)
	c := &wireClient{}

	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine, in the other namespace

		if err := netns.Set(h); err != nil {
			errc <- err

			return
		}

		c.conn, err = dhcp.ListenPacket(t.Context(), s.clientIf, dhcpv4.ClientPort, 1<<20)
		errc <- err
	}()

	require.NoError(t, <-errc)
	t.Cleanup(func() { c.conn.Close() }) //nolint:errcheck

	return c
}

func (c *wireClient) send(t *testing.T, m *dhcpv4.DHCPv4) {
	t.Helper()

	_, err := c.conn.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort})
	require.NoError(t, err)
}

// await reads replies until one for xid arrives (nil when none does within wait).
func (c *wireClient) await(t *testing.T, xid dhcpv4.TransactionID, wait time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()

	buf := make([]byte, 1500)
	deadline := time.Now().Add(wait)

	for {
		require.NoError(t, c.conn.SetReadDeadline(deadline))

		n, _, err := c.conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			require.ErrorAs(t, err, &ne)
			require.True(t, ne.Timeout(), "read: %v", err)

			return nil
		}

		if r, err := dhcpv4.FromBytes(buf[:n]); err == nil && r.TransactionID == xid && r.OpCode == dhcpv4.OpcodeBootReply {
			return r
		}
	}
}

// exchange sends m (with a fresh xid) until a reply comes, up to tries times a second apart.
func (c *wireClient) exchange(t *testing.T, tries int, mac net.HardwareAddr, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()

	var xid dhcpv4.TransactionID

	_, _ = rand.Read(xid[:]) //nolint:errcheck

	m := msg(t, mac, mt, append([]dhcpv4.Modifier{dhcpv4.WithTransactionID(xid), dhcpv4.WithBroadcast(true)}, mods...)...)

	for range tries {
		c.send(t, m)

		if r := c.await(t, xid, time.Second); r != nil {
			return r
		}
	}

	return nil
}

// bind runs DISCOVER and REQUEST for mac and returns the acknowledged address.
func (c *wireClient) bind(t *testing.T, mac net.HardwareAddr) net.IP {
	t.Helper()

	offer := c.exchange(t, 5, mac, dhcpv4.MessageTypeDiscover)
	require.NotNil(t, offer, "no OFFER for %s", mac)
	require.Equal(t, dhcpv4.MessageTypeOffer, offer.MessageType())

	ack := c.exchange(t, 5, mac, dhcpv4.MessageTypeRequest, requested(offer.YourIPAddr.String()), serverID("10.77.0.2"))
	require.NotNil(t, ack, "no ACK for %s", mac)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType(), "%s: %s", mac, ack.Message())

	return ack.YourIPAddr
}

func fullSite(start, end string) *bootpb.DHCP {
	return &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.77.0.0/24", PoolStart: start, PoolEnd: end,
		Gateway: "10.77.0.1", LeaseSeconds: 600,
		Reservations: []*bootpb.DHCPReservation{{Mac: "52:54:00:77:00:42", Ip: "10.77.0.42"}},
	}
}

func clientMAC(group, i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x01, byte(group), byte(i >> 8), byte(i)}
}

// Bad input: the pool runs out. The next new client is refused (no OFFER, a drop with its reason) and the
// clients that have leases are still served (a renewal is ACKed).
func TestFullModePoolExhausted(t *testing.T) {
	needRoot(t)

	seg := newSegment(t)
	edge := seg.startEdge(t, t.TempDir(), fullSite("10.77.0.100", "10.77.0.103"))
	defer edge.stop()

	c := seg.newWireClient(t)

	for i := range 4 {
		c.bind(t, clientMAC(1, i))
	}

	require.Nil(t, c.exchange(t, 2, clientMAC(1, 99), dhcpv4.MessageTypeDiscover), "an OFFER from an exhausted pool")
	require.InDelta(t, 2, testutil.ToFloat64(edge.srv.DropsCounter(dhcp.DropPoolExhausted)), 0, "each refused DISCOVER counted")

	bound, _, _ := edge.srv.LeaseCounts()
	require.Equal(t, 4, bound)

	ack := c.exchange(t, 3, clientMAC(1, 2), dhcpv4.MessageTypeRequest, requested("10.77.0.102"))
	require.NotNil(t, ack)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType(), "a lease holder renews in a full pool")
}

// Bad input: a flood of DISCOVERs from random MACs. Pending offers stay bounded (a quarter of the pool), a known
// client binds during the flood, and after it new clients still get addresses.
func TestFullModeDiscoverFlood(t *testing.T) {
	needRoot(t)

	seg := newSegment(t)
	edge := seg.startEdge(t, t.TempDir(), fullSite("10.77.0.100", "10.77.0.199")) // 100 addresses: 25 offers at most
	defer edge.stop()

	flooder := seg.newWireClient(t)
	c := seg.newWireClient(t)

	const flood = 3000

	done := make(chan struct{})

	go func() {
		defer close(done)

		mac := make(net.HardwareAddr, 6)

		for range flood {
			_, _ = rand.Read(mac) //nolint:errcheck
			mac[0] = mac[0]&0xfc | 0x02

			m, err := dhcpv4.NewDiscovery(mac, dhcpv4.WithBroadcast(true))
			if err != nil {
				return
			}

			if _, err := flooder.conn.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}); err != nil {
				return
			}
		}
	}()

	ip := c.bind(t, clientMAC(2, 1))
	<-done

	require.True(t, ip.To4()[3] >= 100 && ip.To4()[3] <= 199, "%s in the pool", ip)

	_, offered, _ := edge.srv.LeaseCounts()
	require.LessOrEqual(t, offered, 25, "pending offers bounded by a quarter of the pool")

	requests := testutil.ToFloat64(edge.srv.RequestsCounter("dhcp"))
	require.Greater(t, requests, 100.0, "the flood reached the edge")
	t.Logf("flood of %d DISCOVERs: %.0f read by the edge, %d offers pending, %.0f dropped for a full queue", flood, requests, offered,
		testutil.ToFloat64(edge.srv.DropsCounter(dhcp.DropQueueFull)))

	for i := range 3 {
		c.bind(t, clientMAC(2, 10+i))
	}

	bound, _, _ := edge.srv.LeaseCounts()
	require.Equal(t, 4, bound, "only the real clients hold leases")
}

// Bad input: a client asks for another's reservation. Its REQUEST is NAKed (counted by reason), its DISCOVER
// naming the address is offered a pool address instead, and the owner still gets its address.
func TestFullModeReservationOfAnother(t *testing.T) {
	needRoot(t)

	seg := newSegment(t)
	edge := seg.startEdge(t, t.TempDir(), fullSite("10.77.0.100", "10.77.0.110"))
	defer edge.stop()

	c := seg.newWireClient(t)
	thief := clientMAC(3, 1)

	nak := c.exchange(t, 3, thief, dhcpv4.MessageTypeRequest, requested("10.77.0.42"))
	require.NotNil(t, nak)
	require.Equal(t, dhcpv4.MessageTypeNak, nak.MessageType())
	require.Equal(t, string(dhcp.NakReservedForOther), nak.Message())
	require.InDelta(t, 1, testutil.ToFloat64(edge.srv.NaksCounter(dhcp.NakReservedForOther)), 0)

	offer := c.exchange(t, 3, thief, dhcpv4.MessageTypeDiscover, requested("10.77.0.42"))
	require.NotNil(t, offer)
	require.Equal(t, "10.77.0.100", offer.YourIPAddr.String(), "a pool address, not the reservation")

	require.Equal(t, "10.77.0.42", c.bind(t, net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 0x42}).String())

	// The thief, bound to a pool address, asks for the reservation on renewal: NAKed again.
	nak = c.exchange(t, 3, thief, dhcpv4.MessageTypeRequest, requested("10.77.0.42"))
	require.NotNil(t, nak)
	require.Equal(t, dhcpv4.MessageTypeNak, nak.MessageType())
	require.InDelta(t, 2, testutil.ToFloat64(edge.srv.NaksCounter(dhcp.NakReservedForOther)), 0)
}

// Bad input: a DECLINE storm (clients bind and decline, one after another). At most a quarter of the pool is
// held back, each address for the decline hold only (persisted with its end), further DECLINEs are counted
// and refused, and new clients still get addresses.
func TestFullModeDeclineStorm(t *testing.T) {
	needRoot(t)

	seg := newSegment(t)
	state := t.TempDir()
	edge := seg.startEdge(t, state, fullSite("10.77.0.100", "10.77.0.119")) // 20 addresses: 5 held back at most
	defer edge.stop()

	c := seg.newWireClient(t)
	start := time.Now()

	const decliners = 30

	for i := range decliners {
		mac := clientMAC(4, i)
		ip := c.bind(t, mac)

		var xid dhcpv4.TransactionID

		_, _ = rand.Read(xid[:]) //nolint:errcheck

		c.send(t, msg(t, mac, dhcpv4.MessageTypeDecline, dhcpv4.WithTransactionID(xid), requested(ip.String()), serverID("10.77.0.2")))
	}

	// DECLINEs get no reply: wait for the last to be counted.
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(edge.srv.DropsCounter(dhcp.DropDeclineLimit)) < decliners-5 {
		require.True(t, time.Now().Before(deadline), "%.0f DECLINEs refused beyond the bound, want %d",
			testutil.ToFloat64(edge.srv.DropsCounter(dhcp.DropDeclineLimit)), decliners-5)
		time.Sleep(10 * time.Millisecond) // polling the counter
	}

	bound, _, held := edge.srv.LeaseCounts()
	require.Equal(t, 5, held, "a quarter of the pool held back")
	require.Zero(t, bound, "every decliner gave its lease up")

	raw, err := os.ReadFile(filepath.Join(state, dhcp.LeaseFileName))
	require.NoError(t, err)

	var f struct {
		Held []struct {
			Until time.Time `json:"until"`
		} `json:"held_back"`
	}

	require.NoError(t, json.Unmarshal(raw, &f))
	require.Len(t, f.Held, 5)

	for _, h := range f.Held {
		require.WithinRange(t, h.Until, start.Add(dhcp.DefaultLeaseLimits().DeclineHold-time.Second), time.Now().Add(dhcp.DefaultLeaseLimits().DeclineHold),
			"held back for the decline hold, not for good")
	}

	for i := range 10 {
		c.bind(t, clientMAC(5, i))
	}
}

// Bad input: malformed options. None is answered, each is counted as a drop, and a client binds afterwards.
func TestFullModeMalformedOptions(t *testing.T) {
	needRoot(t)

	seg := newSegment(t)
	edge := seg.startEdge(t, t.TempDir(), fullSite("10.77.0.100", "10.77.0.110"))
	defer edge.stop()

	c := seg.newWireClient(t)

	bad := malformedRequests(t, clientMAC(6, 1))
	requests := testutil.ToFloat64(edge.srv.RequestsCounter("dhcp"))

	for name, raw := range bad {
		_, err := c.conn.WriteTo(raw, &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort})
		require.NoError(t, err, name)

		var xid dhcpv4.TransactionID

		copy(xid[:], raw[4:8])
		require.Nil(t, c.await(t, xid, 300*time.Millisecond), "%s: answered", name)
	}

	require.InDelta(t, requests+float64(len(bad)), testutil.ToFloat64(edge.srv.RequestsCounter("dhcp")), 0, "each read")

	var drops float64
	for _, r := range []dhcp.DropReason{dhcp.DropMalformed, dhcp.DropUnexpectedFullMsg, dhcp.DropNoAddress} {
		drops += testutil.ToFloat64(edge.srv.DropsCounter(r))
		t.Logf("drops %s: %.0f", r, testutil.ToFloat64(edge.srv.DropsCounter(r)))
	}

	require.InDelta(t, len(bad), drops, 0, "each dropped with its reason")

	require.Equal(t, "10.77.0.100", c.bind(t, clientMAC(6, 2)).String())
}
