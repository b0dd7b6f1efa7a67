//go:build !linux

package dhcp

import (
	"context"
	"errors"
	"net"
)

// ListenPacket needs SO_BINDTODEVICE, which only Linux has; the edge runs on Linux (Talos).
func ListenPacket(context.Context, string, int, int) (net.PacketConn, error) {
	return nil, errors.New("proxydhcp sockets need linux (SO_BINDTODEVICE)")
}
