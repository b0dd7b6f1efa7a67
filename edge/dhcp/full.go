package dhcp

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"go.uber.org/zap"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// SiteDHCP gives the site's DHCP service as the controller set it; the boot table implements it.
type SiteDHCP interface {
	// DHCP is the service (nil: the edge's own, proxy); the same pointer until it changes.
	DHCP() *bootpb.DHCP
}

// Prober checks whether an address is in use on the segment before it is offered.
type Prober interface {
	// Probe returns the hardware address of the host that answers for ip, nil when none answers in time.
	Probe(ctx context.Context, ip netip.Addr) (net.HardwareAddr, error)
}

// ServiceOf is the service a site's DHCP setting asks for.
func ServiceOf(d *bootpb.DHCP) Service {
	switch d.GetMode() {
	case bootpb.DHCPMode_DHCP_MODE_FULL:
		return ServeFull
	case bootpb.DHCPMode_DHCP_MODE_OFF:
		return ServeOff
	default:
		return ServeProxy
	}
}

// poolState is the parsed pool of one DHCP setting (cached by its pointer).
type poolState struct {
	src  *bootpb.DHCP
	pool *Pool
}

// maxProbes bounds the addresses one DISCOVER probes before it is dropped.
const maxProbes = 3

// service returns the service asked for now and, for full mode, the pool (nil when the setting cannot serve
// here: logged once per setting).
func (s *Server) service() (Service, *Pool) {
	if s.deps.Site == nil {
		return ServeProxy, nil
	}

	src := s.deps.Site.DHCP()

	svc := ServiceOf(src)
	if svc != ServeFull {
		return svc, nil
	}

	if cur := s.pool.Load(); cur != nil && cur.src == src {
		return svc, cur.pool
	}

	pool, err := NewPool(src, s.params.ServerIP)
	if err != nil {
		s.log.Warn("full dhcp mode refused: its setting cannot serve this edge's segment; answering as proxy", zap.Error(err))
	}

	s.pool.Store(&poolState{src: src, pool: pool})

	return svc, pool
}

// FullWanted reports whether the site asks for full mode (the guard checks the segment only then).
func (s *Server) FullWanted() bool {
	svc, pool := s.service()

	return svc == ServeFull && pool != nil
}

// handleFull answers a request on port 67 in full mode; false hands it to the ProxyDHCP (relayed requests).
func (s *Server) handleFull(ctx context.Context, j job, raw []byte, pool *Pool) bool {
	// Parsed from a copy: the request may outlive the read buffer, which goes back to its pool.
	req, err := dhcpv4.FromBytes(bytes.Clone(raw))
	if err != nil {
		s.drop(DropMalformed, err, j.peer, nil)

		return true
	}

	if s.deps.Guard != nil && bytes.Equal(req.ClientHWAddr, s.deps.Guard.MAC()) {
		s.drop(DropGuardMAC, nil, j.peer, nil)

		return true
	}

	// A DISCOVER may wait for an address probe (up to ProbeTimeout): it is answered from a goroutine of its own,
	// up to MaxProbes at once, so that a storm of new clients does not hold every worker for a probe each.
	// With every probe slot taken it is answered here, the workers' wait being the back pressure.
	if req.MessageType() == dhcpv4.MessageTypeDiscover && s.deps.Probe != nil && req.GatewayIPAddr.IsUnspecified() {
		select {
		case s.probeSlots <- struct{}{}:
			s.probing.Add(1)

			go func() {
				defer func() { <-s.probeSlots; s.probing.Done() }()

				s.answerFull(ctx, j, pool, req)
			}()

			return true
		default:
		}
	}

	return s.answerFull(ctx, j, pool, req)
}

// answerFull decides a full-mode request and sends its reply; false hands it to the ProxyDHCP (relayed).
func (s *Server) answerFull(ctx context.Context, j job, pool *Pool, req *dhcpv4.DHCPv4) bool {
	d := s.decideFull(ctx, pool, req)

	switch {
	case d.Reason == DropRelayed:
		return false
	case d.Action == ActNak:
		s.naks.WithLabelValues(string(d.Reason)).Inc()
	case d.Action == ActDrop, d.Action == ActDecline, d.Action == ActRelease, d.Action == ActForget:
		if d.Reason != "" {
			s.drop(d.Reason, nil, j.peer, req.ClientHWAddr)
		}

		if d.Reason == DropPoolExhausted {
			s.exhausted.Do(func() {
				s.log.Warn("dhcp pool exhausted: new clients get no address until a lease ends or is released",
					zap.Int("pool_size", pool.Size()), zap.Stringer("refused_mac", req.ClientHWAddr))
			})
		}

		s.logLease(d, req)

		return true
	}

	reply, err := s.fullReply(pool, req, d)
	if err != nil {
		s.drop(DropMalformed, err, j.peer, req.ClientHWAddr)

		return true
	}

	dest := fullDestination(s.params, req, d)
	if _, err := j.conn.WriteTo(reply.ToBytes(), net.UDPAddrFromAddrPort(dest)); err != nil {
		s.drop(DropWriteFailed, err, j.peer, req.ClientHWAddr)

		return true
	}

	s.leaseReplies.WithLabelValues(reply.MessageType().String()).Inc()
	s.logLease(d, req)

	return true
}

// decideFull decides and applies under the lease store's lock, probing a new address (outside the lock, its
// offer already holding the address) before it is offered.
func (s *Server) decideFull(ctx context.Context, pool *Pool, req *dhcpv4.DHCPv4) LeaseDecision {
	var d LeaseDecision

	for range maxProbes {
		now := s.deps.Now()

		var refused DropReason

		err := s.deps.Leases.Do(func(st *LeaseState) bool {
			d = DecideLease(pool, st, req, now)
			if d.Action == ActDrop || d.Action == ActNak || d.Action == ActInform {
				return false
			}

			dirty, r := st.Apply(pool, s.cfg.Leases, d, now)
			refused = r

			return dirty
		})
		if err != nil {
			s.log.Error("dhcp leases not persisted", zap.Error(err))

			if d.Action == ActAck {
				return LeaseDecision{Reason: DropWriteFailed, MAC: d.MAC} // never acknowledge a lease a restart would forget
			}
		}

		if refused != "" {
			d.Reason = refused
		}

		if d.Action != ActOffer || !d.Probe || s.deps.Probe == nil {
			return d
		}

		pctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		holder, err := s.deps.Probe.Probe(pctx, d.IP)
		cancel()

		if err != nil {
			s.probeErrors.Inc()
			s.log.Debug("address probe failed; offering unprobed", zap.Stringer("ip", d.IP), zap.Error(err))

			return d
		}

		if holder == nil || bytes.Equal(holder, req.ClientHWAddr) {
			return d
		}

		s.conflicts.Inc()
		s.log.Warn("address in the dhcp pool answers for another host; held back", zap.Stringer("ip", d.IP), zap.Stringer("holder", holder))

		if err := s.deps.Leases.Do(func(st *LeaseState) bool {
			st.Conflict(pool, s.cfg.Leases, d.MAC, d.IP, s.deps.Now())

			return true
		}); err != nil {
			s.log.Error("dhcp leases not persisted", zap.Error(err))
		}
	}

	return LeaseDecision{Reason: DropProbeConflicts, MAC: d.MAC}
}

func (s *Server) logLease(d LeaseDecision, req *dhcpv4.DHCPv4) {
	if ce := s.log.Check(zap.DebugLevel, "dhcp lease"); ce != nil {
		ce.Write(zap.Stringer("mac", req.ClientHWAddr), zap.Int("action", int(d.Action)), zap.Stringer("ip", d.IP),
			zap.String("reason", string(d.Reason)))
	}
}

// fullReply is the OFFER, ACK or NAK for a decision, with the PXE answer for a PXE client the ProxyDHCP would
// answer (RFC 2131 §4.3.1 table 3 for the fields and options).
func (s *Server) fullReply(pool *Pool, req *dhcpv4.DHCPv4, d LeaseDecision) (*dhcpv4.DHCPv4, error) {
	server := net.IP(pool.Server.AsSlice())

	mods := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server))}

	var msgType dhcpv4.MessageType

	switch d.Action {
	case ActNak:
		msgType = dhcpv4.MessageTypeNak
		mods = append(mods, dhcpv4.WithClientIP(net.IPv4zero), dhcpv4.WithOption(dhcpv4.OptMessage(string(d.Reason))))
	case ActInform:
		msgType = dhcpv4.MessageTypeAck
	case ActOffer, ActAck:
		msgType = dhcpv4.MessageTypeOffer
		if d.Action == ActAck {
			msgType = dhcpv4.MessageTypeAck
		}

		mods = append(mods, dhcpv4.WithYourIP(net.IP(d.IP.AsSlice())),
			dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(pool.LeaseTime)),
			dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(pool.LeaseTime/2)),
			dhcpv4.WithOption(dhcpv4.OptRebindingTimeValue(pool.LeaseTime*7/8)))
	}

	mods = append(mods, dhcpv4.WithMessageType(msgType))

	if msgType != dhcpv4.MessageTypeNak {
		mods = append(mods, dhcpv4.WithNetmask(net.CIDRMask(pool.Subnet.Bits(), 32)),
			dhcpv4.WithOption(dhcpv4.OptBroadcastAddress(net.IP(bootpb.Broadcast(pool.Subnet).AsSlice()))))

		if pool.Gateway.IsValid() {
			mods = append(mods, dhcpv4.WithRouter(net.IP(pool.Gateway.AsSlice())))
		}

		if len(pool.DNS) > 0 {
			mods = append(mods, dhcpv4.WithDNS(ips(pool.DNS)...))
		}

		if len(pool.NTP) > 0 {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptNTPServers(ips(pool.NTP)...)))
		}
	}

	reply, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, err
	}

	if msgType != dhcpv4.MessageTypeNak {
		// The PXE answer in the same reply, as the ProxyDHCP would give it (nothing for clients it would not answer).
		boot := Decision{MAC: req.ClientHWAddr}
		if req.Options.Has(dhcpv4.OptionClientSystemArchitectureType) && classifyPXE(req, &boot) &&
			discoveryAllows(s.params, req, &boot) && chooseBootFile(s.params, req, &boot) {
			addBootOptions(s.params, req, reply, msgType, boot)
		}
	}

	return reply, nil
}

func ips(addrs []netip.Addr) []net.IP {
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.IP(a.AsSlice()))
	}

	return out
}

// fullDestination is where a full-mode reply goes (RFC 2131 §4.1): a client that has its address (ciaddr:
// renewing, INFORM) by unicast; everything else, NAKs included, by broadcast (answering an unconfigured
// client by unicast would need an ARP entry the kernel does not let a UDP socket set).
func fullDestination(p Params, req *dhcpv4.DHCPv4, d LeaseDecision) netip.AddrPort {
	port := uint16(orDefault(p.ClientPort, ClientPort))

	if ci := addrOf(req.ClientIPAddr); ci.IsValid() && d.Action != ActNak {
		return netip.AddrPortFrom(ci, port)
	}

	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), port)
}

// guardState is what the guard last found on the segment.
type guardState struct {
	// checked is false until the first check of the segment ended.
	checked bool
	// other is another server that answered (invalid Addr: none).
	other OtherServer
	at    time.Time
}

// atomicGuardState holds a guardState.
type atomicGuardState = atomic.Pointer[guardState]
