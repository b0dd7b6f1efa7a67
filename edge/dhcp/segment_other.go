//go:build !linux

package dhcp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"
)

// RawDiscoverer needs Linux packet sockets; the edge runs on Linux (Talos).
type RawDiscoverer struct {
	Interface string
	Window    time.Duration
	Enter     func(fn func() error) error
}

// Discover implements Discoverer.
func (RawDiscoverer) Discover(context.Context, net.HardwareAddr) ([]OtherServer, error) {
	return nil, errors.New("the dhcp guard needs linux packet sockets")
}

// ARPProber needs Linux packet sockets.
type ARPProber struct {
	Enter func(fn func() error) error
}

// NewARPProber fails off Linux.
func NewARPProber(string) (*ARPProber, error) {
	return nil, errors.New("arp probes need linux packet sockets")
}

// Probe implements Prober.
func (*ARPProber) Probe(context.Context, netip.Addr) (net.HardwareAddr, error) {
	return nil, errors.New("arp probes need linux packet sockets")
}
