package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// RawDiscoverer is the guard's DISCOVER on an interface, through insomniacslk's raw-socket client connection
// (the edge has no address to send from as a client, and other servers' OFFERs go to port 68).
type RawDiscoverer struct {
	Interface string
	// Window is how long OFFERs are collected.
	Window time.Duration
	// Enter runs fn where the interface is (a test's network namespace); nil runs it here.
	Enter func(fn func() error) error
}

// enter runs fn through enter, or here when it is nil.
func enter(e func(func() error) error, fn func() error) error {
	if e == nil {
		return fn()
	}

	return e(fn)
}

// Discover implements Discoverer: answers from the interface's own addresses (the edge's server) are left out.
func (r RawDiscoverer) Discover(ctx context.Context, mac net.HardwareAddr) ([]OtherServer, error) {
	own := map[netip.Addr]bool{}

	var conn net.PacketConn

	if err := enter(r.Enter, func() error {
		if ifi, err := net.InterfaceByName(r.Interface); err == nil {
			addrs, _ := ifi.Addrs() //nolint:errcheck // none: nothing to leave out

			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					own[p.Addr()] = true
				}
			}
		}

		var err error

		conn, err = nclient4.NewRawUDPConn(r.Interface, ClientPort)

		return err
	}); err != nil {
		return nil, fmt.Errorf("open raw dhcp client socket on %s: %w", r.Interface, err)
	}
	defer conn.Close() //nolint:errcheck

	msg, err := dhcpv4.NewDiscovery(mac, dhcpv4.WithBroadcast(true))
	if err != nil {
		return nil, fmt.Errorf("build discover: %w", err)
	}

	if _, err := conn.WriteTo(msg.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: ServerPort}); err != nil {
		return nil, fmt.Errorf("send discover on %s: %w", r.Interface, err)
	}

	deadline := time.Now().Add(r.Window)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}

	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil, err
	}

	var out []OtherServer

	buf := make([]byte, 1500)

	for {
		n, from, err := conn.ReadFrom(buf)

		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return out, nil
		case err != nil:
			return out, fmt.Errorf("read offers on %s: %w", r.Interface, err)
		}

		offer, err := dhcpv4.FromBytes(buf[:n])
		if err != nil || offer.OpCode != dhcpv4.OpcodeBootReply || offer.TransactionID != msg.TransactionID ||
			offer.MessageType() != dhcpv4.MessageTypeOffer {
			continue
		}

		o := OtherServer{ServerID: addrOf(offer.ServerIdentifier())}
		if ua, ok := from.(*net.UDPAddr); ok {
			o.Addr = addrOf(ua.IP)
		}

		if !o.Addr.IsValid() {
			o.Addr = o.ServerID
		}

		if !own[o.Addr] && !own[o.ServerID] {
			out = append(out, o)
		}
	}
}

// ARPProber probes an address with an ARP probe (RFC 5227: sender address 0.0.0.0, so no host's ARP cache
// learns anything) on the interface and returns who answers.
//
// ARP, not ICMP echo: on the edge's own segment every host that holds an address answers ARP for it, firewall
// or not (many drop echo requests), and the answer names the holder's MAC, so a client that already holds its
// address (a reboot, a lost lease) is told apart from a stranger.
type ARPProber struct {
	iface *net.Interface
	// Enter runs fn where the interface is (a test's network namespace); nil runs it here.
	Enter func(fn func() error) error
}

// NewARPProber probes on the named interface.
func NewARPProber(name string) (*ARPProber, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("look up interface %q: %w", name, err)
	}

	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("interface %q has no ethernet address", name)
	}

	return &ARPProber{iface: ifi}, nil
}

// arp field offsets and values (RFC 826) for Ethernet and IPv4.
const (
	arpLen     = 28
	arpRequest = 1
	arpReply   = 2
)

// Probe implements Prober: ctx bounds the wait.
func (a *ARPProber) Probe(ctx context.Context, ip netip.Addr) (net.HardwareAddr, error) {
	var c *packet.Conn

	err := enter(a.Enter, func() error {
		var err error

		c, err = packet.Listen(a.iface, packet.Datagram, unix.ETH_P_ARP, nil)

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open arp socket on %s: %w", a.iface.Name, err)
	}
	defer c.Close() //nolint:errcheck

	target := ip.As4()
	req := make([]byte, arpLen)
	copy(req, []byte{0, 1, 8, 0, 6, 4, 0, arpRequest}) // Ethernet, IPv4, lengths 6 and 4, request
	copy(req[8:14], a.iface.HardwareAddr)              // sender MAC; sender IP 0.0.0.0; target MAC zero
	copy(req[24:28], target[:])

	if _, err := c.WriteTo(req, &packet.Addr{HardwareAddr: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}); err != nil {
		return nil, fmt.Errorf("send arp probe for %s: %w", ip, err)
	}

	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Second)
	}

	if err := c.SetReadDeadline(deadline); err != nil {
		return nil, err
	}

	buf := make([]byte, 128)

	for {
		n, _, err := c.ReadFrom(buf)

		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("read arp on %s: %w", a.iface.Name, err)
		}

		if n < arpLen || buf[2] != 8 || buf[3] != 0 || buf[4] != 6 || buf[5] != 4 {
			continue
		}

		// An answer for ip, or another host probing or announcing it (RFC 5227 §2.1.1).
		if op := buf[7]; (op == arpReply || op == arpRequest) && netip.AddrFrom4([4]byte(buf[14:18])) == ip {
			return net.HardwareAddr(append([]byte(nil), buf[8:14]...)), nil
		}
	}
}
