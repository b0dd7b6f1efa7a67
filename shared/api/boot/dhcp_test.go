package boot_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

func TestParseDHCPPool(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, in, start, end, prefix, err string
	}{
		{name: "range", in: "10.0.0.10-10.0.0.20", start: "10.0.0.10", end: "10.0.0.20"},
		{name: "cidr leaves out network and broadcast", in: "10.0.0.0/24", start: "10.0.0.1", end: "10.0.0.254", prefix: "10.0.0.0/24"},
		{name: "cidr is masked", in: "10.0.0.77/25", start: "10.0.0.1", end: "10.0.0.126", prefix: "10.0.0.0/25"},
		{name: "ipv6", in: "fd00::1-fd00::9", err: "want START-END"},
		{name: "too small", in: "10.0.0.0/31", err: "at least /30"},
		{name: "junk", in: "ten-twenty", err: "want START-END"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			start, end, prefix, err := bootpb.ParseDHCPPool(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.start, start.String())
			require.Equal(t, tc.end, end.String())

			if tc.prefix != "" {
				require.Equal(t, netip.MustParsePrefix(tc.prefix), prefix)
			}
		})
	}
}

func TestDHCPCheck(t *testing.T) {
	t.Parallel()

	good := func() *bootpb.DHCP {
		return &bootpb.DHCP{
			Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.0.0.0/24", PoolStart: "10.0.0.100", PoolEnd: "10.0.0.200",
			Gateway: "10.0.0.1", Dns: []string{"10.0.0.53"}, Ntp: []string{"10.0.0.123"},
			Reservations: []*bootpb.DHCPReservation{{Mac: "52:54:00:00:00:01", Ip: "10.0.0.11"}},
		}
	}

	require.NoError(t, good().Check())
	require.NoError(t, (*bootpb.DHCP)(nil).Check())
	require.NoError(t, (&bootpb.DHCP{Mode: bootpb.DHCPMode_DHCP_MODE_OFF}).Check())

	for _, tc := range []struct {
		name   string
		change func(*bootpb.DHCP)
		err    string
	}{
		{name: "unknown mode", change: func(d *bootpb.DHCP) { d.Mode = 7 }, err: "dhcp mode 7 is not known"},
		{name: "full without a pool", change: func(d *bootpb.DHCP) {
			d.Subnet, d.PoolStart, d.PoolEnd, d.Gateway, d.Reservations = "", "", "", "", nil
		}, err: "full dhcp mode needs a pool"},
		{name: "pool outside the subnet", change: func(d *bootpb.DHCP) { d.PoolEnd = "10.0.1.5" }, err: "dhcp pool end 10.0.1.5 is not a host address"},
		{name: "pool takes the broadcast", change: func(d *bootpb.DHCP) { d.PoolEnd = "10.0.0.255" }, err: "is not a host address"},
		{name: "pool backwards", change: func(d *bootpb.DHCP) { d.PoolStart, d.PoolEnd = "10.0.0.200", "10.0.0.100" }, err: "ends before it starts"},
		{name: "pool too big", change: func(d *bootpb.DHCP) { d.Subnet, d.PoolStart, d.PoolEnd = "10.0.0.0/8", "10.0.0.1", "10.2.0.1" }, err: "at most 65536"},
		{name: "gateway outside", change: func(d *bootpb.DHCP) { d.Gateway = "192.168.0.1" }, err: "dhcp gateway 192.168.0.1"},
		{name: "bad dns", change: func(d *bootpb.DHCP) { d.Dns = []string{"dns.example"} }, err: `dhcp dns server "dns.example"`},
		{name: "reservation outside", change: func(d *bootpb.DHCP) { d.Reservations[0].Ip = "10.1.0.1" }, err: "dhcp reservation of 52:54:00:00:00:01 10.1.0.1"},
		{name: "reservation twice", change: func(d *bootpb.DHCP) {
			d.Reservations = append(d.Reservations, &bootpb.DHCPReservation{Mac: "52:54:00:00:00:02", Ip: "10.0.0.11"})
		}, err: "10.0.0.11 is reserved for 52:54:00:00:00:01 and 52:54:00:00:00:02"},
		{name: "two for one mac", change: func(d *bootpb.DHCP) {
			d.Reservations = append(d.Reservations, &bootpb.DHCPReservation{Mac: "52-54-00-00-00-01", Ip: "10.0.0.12"})
		}, err: "52:54:00:00:00:01 has two"},
		{name: "reservation on the gateway", change: func(d *bootpb.DHCP) { d.Reservations[0].Ip = "10.0.0.1" }, err: "is the gateway"},
		{name: "bad mac", change: func(d *bootpb.DHCP) { d.Reservations[0].Mac = "52:54" }, err: "not a MAC address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			d := good()
			tc.change(d)
			require.ErrorContains(t, d.Check(), tc.err)
		})
	}
}
