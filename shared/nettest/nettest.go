// Package nettest holds network helpers for tests.
package nettest

import (
	"net"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// RefusingAddr returns a loopback TCP address ("127.0.0.1:port") that refuses connections for as long as the
// test runs.
//
// Closing a listener to get a "free" port is not enough for that: the port goes back to the kernel's pool, and a
// listener started by another test or package a moment later can be given it, so a test meant to see a refused
// connection reaches that listener instead. Here a socket stays bound to the port and never listens: a
// connection to it is refused, and no one else can bind it until the test ends.
func RefusingAddr(t testing.TB) string {
	t.Helper()

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}

	t.Cleanup(func() { _ = unix.Close(fd) })

	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind a loopback port: %v", err)
	}

	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}

	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		t.Fatalf("getsockname: %T, want an IPv4 address", sa)
	}

	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}
