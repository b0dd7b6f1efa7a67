package vmedia

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// KernelParamIP is the kernel parameter a static address is given in, the kernel's nfsroot form that Talos
// reads (and the lab's init):
// ip=<client-ip>:<server-ip>:<gw-ip>:<netmask>:<hostname>:<device>:<autoconf>:<dns0-ip>:<dns1-ip>:<ntp0-ip>.
// Talos machinery defines no constant for it.
const KernelParamIP = "ip"

// ErrNoReservation means the site has no address reserved for the machine's MAC: its image could not bring
// the network up.
var ErrNoReservation = errors.New("no address is reserved for the machine (controller site machine add SITE MAC --ip A.B.C.D)")

// Static is a machine's static network configuration.
type Static struct {
	// MAC is the interface the address is reserved for.
	MAC     net.HardwareAddr
	Address netip.Prefix
	// Gateway is the default router (invalid: none).
	Gateway netip.Addr
	// DNS are at most two name servers, NTP at most one time server (what the form carries).
	DNS []netip.Addr
	NTP []netip.Addr
}

// StaticFor finds the static configuration reserved for mac in the site's DHCP settings (the subnet's mask,
// its gateway, DNS and NTP servers). Settings that their own Check refuses are an error.
func StaticFor(d *bootpb.DHCP, mac net.HardwareAddr) (Static, error) {
	if err := d.Check(); err != nil {
		return Static{}, fmt.Errorf("site dhcp settings: %w", err)
	}

	for _, r := range d.GetReservations() {
		if hw, err := net.ParseMAC(r.GetMac()); err != nil || hw.String() != mac.String() {
			continue
		}

		subnet, err := netip.ParsePrefix(d.GetSubnet())
		if err != nil {
			return Static{}, fmt.Errorf("reservation of %s: the site's dhcp settings name no subnet", mac)
		}

		addr, err := netip.ParseAddr(r.GetIp())
		if err != nil {
			return Static{}, fmt.Errorf("reservation of %s: %w", mac, err)
		}

		s := Static{MAC: mac, Address: netip.PrefixFrom(addr, subnet.Bits())}
		s.Gateway, _ = netip.ParseAddr(d.GetGateway())
		s.DNS = addrs(d.GetDns(), 2)
		s.NTP = addrs(d.GetNtp(), 1)

		return s, nil
	}

	return Static{}, fmt.Errorf("%s: %w", mac, ErrNoReservation)
}

func addrs(list []string, most int) []netip.Addr {
	var out []netip.Addr

	for _, v := range list {
		if a, err := netip.ParseAddr(v); err == nil && len(out) < most {
			out = append(out, a)
		}
	}

	return out
}

// KernelArg is the configuration as an ip= kernel argument. The device is left empty: the kernel and Talos
// then configure the first link that comes up.
func (s Static) KernelArg() string {
	at := func(list []netip.Addr, i int) string {
		if i < len(list) {
			return list[i].String()
		}

		return ""
	}

	gw := ""
	if s.Gateway.IsValid() {
		gw = s.Gateway.String()
	}

	fields := []string{
		s.Address.Addr().String(), "", gw, net.IP(net.CIDRMask(s.Address.Bits(), 32)).String(), "", "", "off",
		at(s.DNS, 0), at(s.DNS, 1), at(s.NTP, 0),
	}

	return KernelParamIP + "=" + strings.TrimRight(strings.Join(fields, ":"), ":")
}
