package dhcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Service is which DHCP service the edge gives its site (the controller's per-site setting).
type Service string

// DHCP services.
const (
	// ServeProxy is ProxyDHCP beside the site's own DHCP server: PXE answers only, no leases (the default).
	ServeProxy Service = "proxy"
	// ServeFull is the edge as the site's DHCP server: leases from the pool and reservations, the PXE answer in
	// the same reply, guarded against a second server.
	ServeFull Service = "full"
	// ServeOff answers no DHCP at all.
	ServeOff Service = "off"
)

// DefaultLeaseTime is the lease time when the site sets none.
const DefaultLeaseTime = time.Hour

// Pool is a site's full-mode DHCP service, parsed and ready to decide with.
type Pool struct {
	// Subnet is the served network; Start and End bound the dynamic pool (inclusive).
	Subnet     netip.Prefix
	Start, End netip.Addr
	// Server is the edge's own address in Subnet (option 54; never leased).
	Server netip.Addr
	// Gateway is the clients' router (invalid: none); DNS and NTP their servers.
	Gateway   netip.Addr
	DNS, NTP  []netip.Addr
	LeaseTime time.Duration
	// reserved maps a MAC to its address, reservedBy the other way.
	reserved   map[[6]byte]netip.Addr
	reservedBy map[netip.Addr][6]byte
}

// ErrNotOnSubnet is returned by NewPool when the edge's own address is not in the site's DHCP subnet: full
// mode serves only the edge's own segment.
var ErrNotOnSubnet = errors.New("the edge's address is not in the dhcp subnet")

// NewPool parses the boot table's DHCP service (already checked by bootpb.DHCP.Check) for an edge whose
// address on the segment is server.
func NewPool(d *bootpb.DHCP, server netip.Addr) (*Pool, error) {
	if err := d.Check(); err != nil {
		return nil, err
	}

	subnet, err := netip.ParsePrefix(d.GetSubnet())
	if err != nil {
		return nil, fmt.Errorf("dhcp subnet: %w", err)
	}

	subnet = subnet.Masked()
	if !subnet.Contains(server) {
		return nil, fmt.Errorf("%s in %s: %w", server, subnet, ErrNotOnSubnet)
	}

	p := &Pool{
		Subnet: subnet, Server: server, LeaseTime: time.Duration(d.GetLeaseSeconds()) * time.Second,
		reserved: map[[6]byte]netip.Addr{}, reservedBy: map[netip.Addr][6]byte{},
	}

	if p.LeaseTime <= 0 {
		p.LeaseTime = DefaultLeaseTime
	}

	p.Start, _ = netip.ParseAddr(d.GetPoolStart())
	p.End, _ = netip.ParseAddr(d.GetPoolEnd())
	p.Gateway, _ = netip.ParseAddr(d.GetGateway())

	for _, s := range d.GetDns() {
		p.DNS = append(p.DNS, netip.MustParseAddr(s)) // checked
	}

	for _, s := range d.GetNtp() {
		p.NTP = append(p.NTP, netip.MustParseAddr(s))
	}

	for _, r := range d.GetReservations() {
		hw, _ := net.ParseMAC(r.GetMac()) // checked
		ip := netip.MustParseAddr(r.GetIp())
		p.reserved[[6]byte(hw)], p.reservedBy[ip] = ip, [6]byte(hw)
	}

	return p, nil
}

// Size is the number of addresses in the dynamic pool.
func (p *Pool) Size() int { return bootpb.PoolSize(p.Start, p.End) }

// inPool reports whether ip is in the dynamic range.
func (p *Pool) inPool(ip netip.Addr) bool {
	return ip.Is4() && !ip.Less(p.Start) && !p.End.Less(ip)
}

// Reservation is the address reserved for mac, if any.
func (p *Pool) Reservation(mac [6]byte) (netip.Addr, bool) {
	ip, ok := p.reserved[mac]

	return ip, ok
}

// never reports addresses that are never leased: the edge's own, the gateway, network and broadcast.
func (p *Pool) never(ip netip.Addr) bool {
	return ip == p.Server || ip == p.Gateway || ip == p.Subnet.Addr() || ip == bootpb.Broadcast(p.Subnet)
}

// LeaseAction is what the full-mode server does with a request.
type LeaseAction int

// Lease actions.
const (
	// ActDrop: no reply (Reason says why).
	ActDrop LeaseAction = iota
	// ActOffer: an OFFER of IP (probe it first when Probe).
	ActOffer
	// ActAck: an ACK binding IP to the client.
	ActAck
	// ActNak: a NAK (Reason says why).
	ActNak
	// ActDecline: the client found IP in use; it is held back for a while.
	ActDecline
	// ActRelease: the client gave IP back.
	ActRelease
	// ActInform: an ACK with the options only (DHCPINFORM, RFC 2131 §3.4).
	ActInform
	// ActForget: the client took another server's offer; the edge's offer is withdrawn.
	ActForget
)

// Reasons a full-mode request is dropped or NAKed (the "reason" label of the drop and NAK counters).
const (
	DropPoolExhausted     DropReason = "pool_exhausted"
	DropRelayed           DropReason = "relayed"
	DropNoAddress         DropReason = "no_requested_address"
	DropNotItsAddress     DropReason = "not_its_address"
	DropReservedInUse     DropReason = "reservation_in_use"
	DropDeclineLimit      DropReason = "decline_limit"
	DropGuardMAC          DropReason = "own_guard_probe"
	DropDHCPOff           DropReason = "dhcp_off"
	DropProbeConflicts    DropReason = "probe_conflicts"
	NakWrongSubnet        DropReason = "wrong_subnet"
	NakReservedForOther   DropReason = "reserved_for_other"
	NakNotItsReservation  DropReason = "not_its_reservation"
	NakNotInPool          DropReason = "not_in_pool"
	NakDeclined           DropReason = "declined_address"
	NakLeasedToOther      DropReason = "leased_to_other"
	NakNeverLeased        DropReason = "never_leased_address"
	DropUnexpectedFullMsg DropReason = "unexpected_message_type"
)

// LeaseDecision is the outcome of DecideLease.
type LeaseDecision struct {
	Action LeaseAction
	// IP is the address offered, acknowledged, declined or released.
	IP netip.Addr
	// Probe says the address is new to the client and must be probed before it is offered.
	Probe bool
	// Reason says why a request is dropped or NAKed.
	Reason DropReason
	MAC    [6]byte
}

// DecideLease decides a full-mode request from the pool and the lease state at now; it changes nothing (the
// server applies the decision with LeaseState.Apply) and never panics on any request.
func DecideLease(p *Pool, st *LeaseState, req *dhcpv4.DHCPv4, now time.Time) LeaseDecision {
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return LeaseDecision{Reason: DropBadHardware}
	}

	mac := [6]byte(req.ClientHWAddr)
	d := LeaseDecision{MAC: mac}

	if gw := req.GatewayIPAddr.To4(); gw != nil && !gw.IsUnspecified() {
		d.Reason = DropRelayed // full mode serves the edge's own segment; relayed clients get proxy answers

		return d
	}

	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		return decideDiscover(p, st, req, now, d)
	case dhcpv4.MessageTypeRequest:
		return decideRequest(p, st, req, now, d)
	case dhcpv4.MessageTypeDecline:
		ip := addrOf(req.RequestedIPAddress())
		if l := st.byMAC[mac]; l == nil || l.IP != ip || !ip.IsValid() {
			d.Reason = DropNotItsAddress // a client declines only what it was given: no storm of others' addresses

			return d
		}

		d.Action, d.IP = ActDecline, ip
	case dhcpv4.MessageTypeRelease:
		ip := addrOf(req.ClientIPAddr)
		if l := st.byMAC[mac]; l == nil || l.IP != ip || l.Offered {
			d.Reason = DropNotItsAddress

			return d
		}

		d.Action, d.IP = ActRelease, ip
	case dhcpv4.MessageTypeInform:
		ip := addrOf(req.ClientIPAddr)
		if !ip.IsValid() || !p.Subnet.Contains(ip) {
			d.Reason = DropNoAddress

			return d
		}

		d.Action, d.IP = ActInform, ip
	default:
		d.Reason = DropUnexpectedFullMsg
	}

	return d
}

func decideDiscover(p *Pool, st *LeaseState, req *dhcpv4.DHCPv4, now time.Time, d LeaseDecision) LeaseDecision {
	mac := d.MAC

	if ip, ok := p.reserved[mac]; ok {
		if l := st.byIP[ip]; l != nil && l.MAC != mac && l.live(now) {
			d.Reason = DropReservedInUse // another client holds it until its lease ends or its renewal is NAKed

			return d
		}

		l := st.byMAC[mac]
		d.Action, d.IP, d.Probe = ActOffer, ip, l == nil || l.IP != ip || !l.live(now) || l.Offered

		return d
	}

	if l := st.byMAC[mac]; l != nil && st.usable(p, l.IP, mac, now) {
		d.Action, d.IP, d.Probe = ActOffer, l.IP, !l.live(now) || l.Offered

		return d
	}

	if ip := addrOf(req.RequestedIPAddress()); ip.IsValid() && st.usable(p, ip, mac, now) {
		d.Action, d.IP, d.Probe = ActOffer, ip, true

		return d
	}

	if ip, ok := st.free(p, mac, now); ok {
		d.Action, d.IP, d.Probe = ActOffer, ip, true

		return d
	}

	d.Reason = DropPoolExhausted

	return d
}

func decideRequest(p *Pool, st *LeaseState, req *dhcpv4.DHCPv4, now time.Time, d LeaseDecision) LeaseDecision {
	mac := d.MAC

	if sid := addrOf(req.ServerIdentifier()); sid.IsValid() && sid != p.Server {
		d.Action = ActForget // SELECTING another server's offer (RFC 2131 §4.3.2)

		return d
	}

	ip := addrOf(req.RequestedIPAddress())
	if !ip.IsValid() {
		ip = addrOf(req.ClientIPAddr) // RENEWING or REBINDING
	}

	d.IP = ip

	own, reserved := p.reserved[mac]
	holder, taken := p.reservedBy[ip]
	l := st.byIP[ip]

	switch {
	case !ip.IsValid():
		d.Reason = DropNoAddress

		return d
	case !p.Subnet.Contains(ip):
		d.Action, d.Reason = ActNak, NakWrongSubnet
	case taken && holder != mac:
		d.Action, d.Reason = ActNak, NakReservedForOther
	case reserved && own != ip:
		d.Action, d.Reason = ActNak, NakNotItsReservation
	case p.never(ip):
		d.Action, d.Reason = ActNak, NakNeverLeased
	case !reserved && !p.inPool(ip):
		d.Action, d.Reason = ActNak, NakNotInPool
	case st.isBad(ip, now):
		d.Action, d.Reason = ActNak, NakDeclined
	case l != nil && l.MAC != mac && l.live(now) && !l.Offered:
		// Only a bound lease refuses: a pending offer to another (this client's own offer withdrawn for it
		// under a DISCOVER flood) goes to the client that completes its exchange; the other is NAKed if it
		// asks later.
		d.Action, d.Reason = ActNak, NakLeasedToOther
	default:
		d.Action = ActAck
	}

	return d
}

// addrOf is an IPv4 header or option address; invalid for none or 0.0.0.0.
func addrOf(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || a.IsUnspecified() {
		return netip.Addr{}
	}

	return a
}
