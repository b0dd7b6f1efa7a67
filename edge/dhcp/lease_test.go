package dhcp_test

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

var (
	t0       = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	macA     = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0xa}
	macB     = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0xb}
	macR     = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x42}
	edgeAddr = netip.MustParseAddr("10.9.0.2")
)

// testPool is 10.9.0.0/24 with the pool .100-.103, the gateway .1 and .42 reserved for macR.
func testPool(t *testing.T) *dhcp.Pool {
	t.Helper()

	p, err := dhcp.NewPool(&bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.9.0.0/24", PoolStart: "10.9.0.100", PoolEnd: "10.9.0.103",
		Gateway: "10.9.0.1", Dns: []string{"10.9.0.53"}, LeaseSeconds: 600,
		Reservations: []*bootpb.DHCPReservation{{Mac: macR.String(), Ip: "10.9.0.42"}},
	}, edgeAddr)
	require.NoError(t, err)

	return p
}

func msg(t *testing.T, mac net.HardwareAddr, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()

	m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(mt)}, mods...)...)
	require.NoError(t, err)

	return m
}

func requested(ip string) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(ip)))
}

func serverID(ip string) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP(ip)))
}

// step decides and applies, as the server does.
func step(t *testing.T, p *dhcp.Pool, st *dhcp.LeaseState, m *dhcpv4.DHCPv4, now time.Time) dhcp.LeaseDecision {
	t.Helper()

	d := dhcp.DecideLease(p, st, m, now)
	if d.Action != dhcp.ActDrop && d.Action != dhcp.ActNak && d.Action != dhcp.ActInform {
		if _, refused := st.Apply(p, dhcp.DefaultLeaseLimits(), d, now); refused != "" {
			d.Reason = refused
		}
	}

	return d
}

func TestDecideLease(t *testing.T) {
	t.Parallel()

	p := testPool(t)

	t.Run("discover offers the first free address, request binds it, a second client gets the next", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		d := step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, dhcp.ActOffer, d.Action)
		require.Equal(t, "10.9.0.100", d.IP.String())
		require.True(t, d.Probe)

		d = step(t, p, st, msg(t, macB, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, "10.9.0.101", d.IP.String(), "the pending offer holds .100")

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.100"), serverID("10.9.0.2")), t0)
		require.Equal(t, dhcp.ActAck, d.Action)

		l, ok := st.Lease([6]byte(macA))
		require.True(t, ok)
		require.Equal(t, t0.Add(10*time.Minute), l.Expires)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover), t0.Add(time.Minute))
		require.Equal(t, "10.9.0.100", d.IP.String(), "a bound client is offered its own address")
		require.False(t, d.Probe, "nor is it probed: the client itself would answer")
	})

	t.Run("a reservation gets its address, and only its owner", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		d := step(t, p, st, msg(t, macR, dhcpv4.MessageTypeDiscover, requested("10.9.0.100")), t0)
		require.Equal(t, "10.9.0.42", d.IP.String())

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.42")), t0)
		require.Equal(t, dhcp.ActNak, d.Action)
		require.Equal(t, dhcp.NakReservedForOther, d.Reason)

		d = step(t, p, st, msg(t, macR, dhcpv4.MessageTypeRequest, requested("10.9.0.101")), t0)
		require.Equal(t, dhcp.NakNotItsReservation, d.Reason)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover, requested("10.9.0.42")), t0)
		require.Equal(t, "10.9.0.100", d.IP.String(), "asking for another's reservation gets a pool address")
	})

	t.Run("requests the edge does not own are NAKed", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.100")), t0)

		for _, tc := range []struct {
			ip   string
			want dhcp.DropReason
		}{
			{ip: "192.168.1.5", want: dhcp.NakWrongSubnet},
			{ip: "10.9.0.100", want: dhcp.NakLeasedToOther},
			{ip: "10.9.0.7", want: dhcp.NakNotInPool},
			{ip: "10.9.0.2", want: dhcp.NakNeverLeased},
			{ip: "10.9.0.1", want: dhcp.NakNeverLeased},
		} {
			d := step(t, p, st, msg(t, macB, dhcpv4.MessageTypeRequest, requested(tc.ip)), t0)
			require.Equal(t, dhcp.ActNak, d.Action, tc.ip)
			require.Equal(t, tc.want, d.Reason, tc.ip)
		}

		d := step(t, p, st, msg(t, macB, dhcpv4.MessageTypeRequest, requested("10.9.0.100"), serverID("10.9.0.250")), t0)
		require.Equal(t, dhcp.ActForget, d.Action, "another server's offer taken: silence")
	})

	t.Run("a request for an address offered to another binds it; the other is NAKed", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		d := step(t, p, st, msg(t, macB, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, "10.9.0.100", d.IP.String())

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.100"), serverID("10.9.0.2")), t0)
		require.Equal(t, dhcp.ActAck, d.Action, "its own offer was withdrawn for the other's: the one that completes wins")

		d = step(t, p, st, msg(t, macB, dhcpv4.MessageTypeRequest, requested("10.9.0.100"), serverID("10.9.0.2")), t0)
		require.Equal(t, dhcp.NakLeasedToOther, d.Reason)
	})

	t.Run("decline holds the address back, release frees it, a stranger can do neither", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.100")), t0)

		d := step(t, p, st, msg(t, macB, dhcpv4.MessageTypeDecline, requested("10.9.0.100")), t0)
		require.Equal(t, dhcp.DropNotItsAddress, d.Reason)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDecline, requested("10.9.0.100")), t0)
		require.Equal(t, dhcp.ActDecline, d.Action)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, "10.9.0.101", d.IP.String(), "the declined address is held back")
		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.101")), t0)
		require.Equal(t, dhcp.ActAck, d.Action)

		d = step(t, p, st, msg(t, macB, dhcpv4.MessageTypeRelease, dhcpv4.WithClientIP(net.ParseIP("10.9.0.101"))), t0)
		require.Equal(t, dhcp.DropNotItsAddress, d.Reason)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRelease, dhcpv4.WithClientIP(net.ParseIP("10.9.0.101"))), t0)
		require.Equal(t, dhcp.ActRelease, d.Action)

		d = step(t, p, st, msg(t, macB, dhcpv4.MessageTypeRequest, requested("10.9.0.101")), t0)
		require.Equal(t, dhcp.ActAck, d.Action, "released: another may have it")

		d = step(t, p, st, msg(t, macB, dhcpv4.MessageTypeDiscover), t0.Add(11*time.Minute))
		require.Equal(t, "10.9.0.101", d.IP.String())
	})

	t.Run("inform is answered, relayed requests are left to the proxy", func(t *testing.T) {
		t.Parallel()

		st := dhcp.NewLeaseState()
		d := step(t, p, st, msg(t, macA, dhcpv4.MessageTypeInform, dhcpv4.WithClientIP(net.ParseIP("10.9.0.7"))), t0)
		require.Equal(t, dhcp.ActInform, d.Action)

		d = step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.ParseIP("10.1.0.1"))), t0)
		require.Equal(t, dhcp.DropRelayed, d.Reason)
	})
}

// Bad input: a DISCOVER flood with random MACs holds at most a quarter of the pool, for the offer lifetime; the
// pool running out is a drop with its reason; a DECLINE storm holds back at most a quarter.
func TestLeaseBounds(t *testing.T) {
	t.Parallel()

	p, err := dhcp.NewPool(&bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.9.0.0/24", PoolStart: "10.9.0.10", PoolEnd: "10.9.0.49",
	}, edgeAddr)
	require.NoError(t, err)

	st := dhcp.NewLeaseState()

	for i := range 1000 {
		d := step(t, p, st, msg(t, net.HardwareAddr{0x02, 0, 0, 0, byte(i >> 8), byte(i)}, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, dhcp.ActOffer, d.Action, "flooder %d", i)
	}

	_, offered, _ := st.Counts(t0)
	require.Equal(t, 10, offered, "a quarter of the 40 addresses")

	d := step(t, p, st, msg(t, macA, dhcpv4.MessageTypeDiscover), t0)
	require.Equal(t, dhcp.ActOffer, d.Action, "others are still served")

	for i := range 40 {
		m := net.HardwareAddr{0x02, 1, 0, 0, 0, byte(i)}
		d := step(t, p, st, msg(t, m, dhcpv4.MessageTypeDiscover), t0)
		require.Equal(t, dhcp.ActOffer, d.Action)
		d = step(t, p, st, msg(t, m, dhcpv4.MessageTypeDecline, requested(d.IP.String())), t0)
		if i >= 10 {
			require.Equal(t, dhcp.DropDeclineLimit, d.Reason, "decline %d", i)
		}
	}

	_, _, bad := st.Counts(t0)
	require.Equal(t, 10, bad)

	st2 := dhcp.NewLeaseState()
	for i := range 40 {
		m := net.HardwareAddr{0x02, 3, 0, 0, 0, byte(i)}
		ip := netip.MustParseAddr("10.9.0.10")
		for range i {
			ip = ip.Next()
		}
		require.Equal(t, dhcp.ActAck, step(t, p, st2, msg(t, m, dhcpv4.MessageTypeRequest, requested(ip.String())), t0).Action)
	}

	d = step(t, p, st2, msg(t, macA, dhcpv4.MessageTypeDiscover), t0)
	require.Equal(t, dhcp.ActDrop, d.Action)
	require.Equal(t, dhcp.DropPoolExhausted, d.Reason)

	d = step(t, p, st2, msg(t, macA, dhcpv4.MessageTypeDiscover), t0.Add(time.Hour+time.Second))
	require.Equal(t, dhcp.ActOffer, d.Action, "expired leases are taken back when the pool runs out")
}

// Leases survive a restart; offers do not; a lease file that does not decode is moved aside.
func TestLeaseStoreRestart(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	p := testPool(t)
	log := zaptest.NewLogger(t)

	store, err := dhcp.OpenLeases(dir, log)
	require.NoError(t, err)

	require.NoError(t, store.Do(func(st *dhcp.LeaseState) bool {
		step(t, p, st, msg(t, macA, dhcpv4.MessageTypeRequest, requested("10.9.0.101")), t0)
		step(t, p, st, msg(t, macB, dhcpv4.MessageTypeDiscover), t0)
		step(t, p, st, msg(t, macR, dhcpv4.MessageTypeRequest, requested("10.9.0.42")), t0)

		return true
	}))

	reopened, err := dhcp.OpenLeases(dir, log)
	require.NoError(t, err)
	require.NoError(t, reopened.Do(func(st *dhcp.LeaseState) bool {
		l, ok := st.Lease([6]byte(macA))
		require.True(t, ok)
		require.Equal(t, "10.9.0.101", l.IP.String())
		require.True(t, l.Expires.Equal(t0.Add(10*time.Minute)))

		_, ok = st.Lease([6]byte(macB))
		require.False(t, ok, "an offer is not persisted")

		d := dhcp.DecideLease(p, st, msg(t, macA, dhcpv4.MessageTypeDiscover), t0.Add(time.Minute))
		require.Equal(t, "10.9.0.101", d.IP.String(), "the client gets its address back after the restart")

		d = dhcp.DecideLease(p, st, msg(t, macB, dhcpv4.MessageTypeRequest, requested("10.9.0.101")), t0.Add(time.Minute))
		require.Equal(t, dhcp.NakLeasedToOther, d.Reason)

		return false
	}))

	require.NoError(t, os.WriteFile(filepath.Join(dir, dhcp.LeaseFileName), []byte(`{"leases":[{"mac":"zz","ip":"x"}]}`), 0o600))
	broken, err := dhcp.OpenLeases(dir, log)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(dir, dhcp.LeaseFileName+".corrupt"))
	require.NoError(t, broken.Do(func(st *dhcp.LeaseState) bool {
		b, o, h := st.Counts(t0)
		require.Zero(t, b+o+h)

		return false
	}))
}

// The lease decision never panics on any packet.
func FuzzDecideLease(f *testing.F) {
	for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeDecline,
		dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform} {
		m, _ := dhcpv4.New(dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(mt), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("10.9.0.100"))))
		f.Add(m.ToBytes())
	}

	for _, raw := range malformedRequests(f, macA) {
		f.Add(raw)
	}

	pool, err := dhcp.NewPool(&bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.9.0.0/24", PoolStart: "10.9.0.100", PoolEnd: "10.9.0.103",
		Reservations: []*bootpb.DHCPReservation{{Mac: macR.String(), Ip: "10.9.0.42"}},
	}, edgeAddr)
	require.NoError(f, err)

	st := dhcp.NewLeaseState()

	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := dhcpv4.FromBytes(raw)
		if err != nil {
			return
		}

		d := dhcp.DecideLease(pool, st, req, t0)
		if d.Action != dhcp.ActDrop && d.Action != dhcp.ActNak && d.Action != dhcp.ActInform {
			st.Apply(pool, dhcp.DefaultLeaseLimits(), d, t0)
		}
	})
}

// malformedRequests are requests from one MAC whose options are broken: each must get no reply, cost a drop
// with its reason, and leave the server serving.
func malformedRequests(t testing.TB, mac net.HardwareAddr) map[string][]byte {
	t.Helper()

	m, err := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover))
	require.NoError(t, err)

	header := m.ToBytes()[:240] // BOOTP header and magic cookie (RFC 2131 §3)

	with := func(opts ...byte) []byte { return append(append([]byte{}, header...), opts...) }

	badCookie := with(53, 1, 1, 255)
	badCookie[236] = 0

	return map[string][]byte{
		"option overruns the packet":   with(53, 1, 1, 50, 200, 10, 77),
		"message type of length zero":  with(53, 0, 255),
		"message type unknown":         with(53, 1, 42, 255),
		"requested address of 3 bytes": with(53, 1, 3, 50, 3, 10, 77, 0, 255),
		"no magic cookie":              badCookie,
		"no options at all":            header[:236],
	}
}
