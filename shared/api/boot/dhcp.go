package boot

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// dhcpModeNames are the names an operator uses for each DHCP mode.
var dhcpModeNames = map[DHCPMode]string{
	DHCPMode_DHCP_MODE_UNSPECIFIED: "",
	DHCPMode_DHCP_MODE_PROXY:       "proxy",
	DHCPMode_DHCP_MODE_FULL:        "full",
	DHCPMode_DHCP_MODE_OFF:         "off",
}

// ParseDHCPMode maps a mode's name (proxy, full, off; empty for the edge's own) to the table's value.
func ParseDHCPMode(name string) (DHCPMode, error) {
	for m, n := range dhcpModeNames {
		if n == name {
			return m, nil
		}
	}

	return 0, fmt.Errorf("dhcp mode %q: want proxy, full or off", name)
}

// Name is the mode's name (proxy, full, off), "" for none or a value this build does not know.
func (m DHCPMode) Name() string { return dhcpModeNames[m] }

// MaxDHCPPool bounds the addresses of one pool (a /16): the edge scans it for a free address.
const MaxDHCPPool = 1 << 16

// MaxDHCPServers bounds the DNS and NTP servers given to clients (each list).
const MaxDHCPServers = 8

// ParseDHCPPool reads a pool as an operator writes it: "START-END" (inclusive) or a CIDR range, whose
// network and broadcast addresses are left out; prefix is the CIDR's (invalid for a range).
func ParseDHCPPool(s string) (start, end netip.Addr, prefix netip.Prefix, err error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		start, err1 := netip.ParseAddr(strings.TrimSpace(a))
		end, err2 := netip.ParseAddr(strings.TrimSpace(b))

		if err1 != nil || err2 != nil || !start.Is4() || !end.Is4() {
			return netip.Addr{}, netip.Addr{}, netip.Prefix{}, fmt.Errorf("dhcp pool %q: want START-END of IPv4 addresses or a CIDR range", s)
		}

		return start, end, netip.Prefix{}, nil
	}

	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		return netip.Addr{}, netip.Addr{}, netip.Prefix{}, fmt.Errorf("dhcp pool %q: want START-END of IPv4 addresses or an IPv4 CIDR range of at least /30", s)
	}

	p = p.Masked()

	return p.Addr().Next(), Broadcast(p).Prev(), p, nil
}

// Broadcast is the last address of an IPv4 prefix.
func Broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1

	v := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) | host

	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// PoolSize is the number of addresses from start to end inclusive (0 when end is before start).
func PoolSize(start, end netip.Addr) int {
	if !start.Is4() || !end.Is4() || end.Less(start) {
		return 0
	}

	s, e := start.As4(), end.As4()
	u := func(b [4]byte) uint32 { return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) }

	return int(u(e)-u(s)) + 1
}

// Check checks a site's DHCP service as a whole: the mode is known; in full mode a subnet and a pool are
// given; the pool lies inside the subnet (neither its network nor its broadcast address) and holds at most
// MaxDHCPPool addresses; the gateway and every reservation lie in the subnet; no address is reserved twice
// and no MAC has two reservations; servers are IPv4 addresses. A nil DHCP is the edge's own (proxy).
func (d *DHCP) Check() error {
	if d == nil {
		return nil
	}

	var errs []error

	if _, ok := dhcpModeNames[d.GetMode()]; !ok {
		errs = append(errs, fmt.Errorf("dhcp mode %d is not known", d.GetMode()))
	}

	subnet, err := netip.ParsePrefix(d.GetSubnet())

	switch {
	case d.GetSubnet() == "":
		if d.GetMode() == DHCPMode_DHCP_MODE_FULL {
			errs = append(errs, errors.New("full dhcp mode needs a pool (--dhcp-pool) and its subnet"))
		}

		if d.GetPoolStart() != "" || d.GetGateway() != "" || len(d.GetReservations()) > 0 {
			errs = append(errs, errors.New("a dhcp pool, gateway or reservation needs the subnet (--dhcp-subnet, or a CIDR --dhcp-pool)"))
		}

		subnet = netip.Prefix{}
	case err != nil || !subnet.Addr().Is4() || subnet.Bits() > 30 || subnet.Bits() < 8:
		errs = append(errs, fmt.Errorf("dhcp subnet %q: want an IPv4 CIDR between /8 and /30", d.GetSubnet()))

		subnet = netip.Prefix{}
	}

	inSubnet := func(what, s string) (netip.Addr, bool) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("%s %q is not an IPv4 address", what, s))

			return a, false
		}

		if subnet.IsValid() && (!subnet.Contains(a) || a == subnet.Masked().Addr() || a == Broadcast(subnet)) {
			errs = append(errs, fmt.Errorf("%s %s is not a host address of the subnet %s", what, a, subnet))

			return a, false
		}

		return a, true
	}

	if subnet.IsValid() {
		switch {
		case d.GetPoolStart() == "" && d.GetPoolEnd() == "" && d.GetMode() != DHCPMode_DHCP_MODE_FULL:
			// A site without DHCP (off) names its subnet for the static addresses its machines boot with
			// from virtual media: no pool to lease from.
		case d.GetPoolStart() == "" || d.GetPoolEnd() == "":
			errs = append(errs, errors.New("the dhcp subnet needs a pool (--dhcp-pool)"))
		default:
			start, ok1 := inSubnet("dhcp pool start", d.GetPoolStart())
			end, ok2 := inSubnet("dhcp pool end", d.GetPoolEnd())

			switch n := PoolSize(start, end); {
			case !ok1 || !ok2:
			case n == 0:
				errs = append(errs, fmt.Errorf("dhcp pool %s-%s ends before it starts", start, end))
			case n > MaxDHCPPool:
				errs = append(errs, fmt.Errorf("dhcp pool %s-%s holds %d addresses, at most %d", start, end, n, MaxDHCPPool))
			}
		}
	}

	if d.GetGateway() != "" {
		inSubnet("dhcp gateway", d.GetGateway())
	}

	for what, list := range map[string][]string{"dhcp dns server": d.GetDns(), "dhcp ntp server": d.GetNtp()} {
		if len(list) > MaxDHCPServers {
			errs = append(errs, fmt.Errorf("%d of %ss, at most %d", len(list), what, MaxDHCPServers))
		}

		for _, s := range list {
			if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
				errs = append(errs, fmt.Errorf("%s %q is not an IPv4 address", what, s))
			}
		}
	}

	byIP, byMAC := map[netip.Addr]string{}, map[string]bool{}

	for _, r := range d.GetReservations() {
		hw, err := net.ParseMAC(r.GetMac())
		if err != nil || len(hw) != 6 {
			errs = append(errs, fmt.Errorf("dhcp reservation for %q: not a MAC address", r.GetMac()))

			continue
		}

		mac := hw.String()
		if byMAC[mac] {
			errs = append(errs, fmt.Errorf("dhcp reservation: %s has two", mac))
		}

		byMAC[mac] = true

		a, ok := inSubnet("dhcp reservation of "+mac, r.GetIp())
		if !ok {
			continue
		}

		if other, taken := byIP[a]; taken {
			errs = append(errs, fmt.Errorf("dhcp reservation: %s is reserved for %s and %s", a, other, mac))
		}

		byIP[a] = mac

		if gw := d.GetGateway(); gw != "" && a.String() == gw {
			errs = append(errs, fmt.Errorf("dhcp reservation of %s: %s is the gateway", mac, a))
		}
	}

	return errors.Join(errs...)
}
