package nettest_test

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/nettest"
)

func TestRefusingAddr(t *testing.T) {
	addr := nettest.RefusingAddr(t)

	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)

	// nobody else can take the port while the test runs
	_, err = net.Listen("tcp", addr)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
}
