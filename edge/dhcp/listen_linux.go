package dhcp

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
)

// ListenPacket opens a UDP socket on the wildcard address and the given port, bound to the interface iface
// with SO_BINDTODEVICE (binding to a unicast address would never see broadcast DISCOVERs), with SO_BROADCAST
// set so replies can be broadcast. An empty iface skips the device binding (tests on loopback).
//
// The receive buffer is raised to readBuffer bytes (SO_RCVBUFFORCE when permitted, else SO_RCVBUF, which the
// kernel caps at net.core.rmem_max) so that a burst of DISCOVERs from a rack powering on is queued, not lost.
func ListenPacket(ctx context.Context, iface string, port, readBuffer int) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error

		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
			}

			if serr == nil && iface != "" {
				serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface)
			}

			if serr == nil && readBuffer > 0 {
				if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, readBuffer) != nil {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, readBuffer)
				}
			}
		})
		if err != nil {
			return err
		}

		return serr
	}}

	conn, err := lc.ListenPacket(ctx, "udp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen on udp port %d (device %q): %w", port, iface, err)
	}

	return conn, nil
}
