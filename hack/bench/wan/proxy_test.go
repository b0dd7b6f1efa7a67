package wanbench_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	wanbench "github.com/outpost-metal/outpost/hack/bench/wan"
)

// noLeaks checks, after the test's other cleanups, that it left no goroutine behind.
func noLeaks(t *testing.T) {
	t.Helper()

	ignore := goleak.IgnoreCurrent()

	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// startProxy runs a delay proxy to target on a loopback port until the test ends and returns it with its address.
func startProxy(t *testing.T, target string, rtt time.Duration) (*wanbench.Proxy, string) {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	p := wanbench.NewProxy(target, rtt, 0)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)

	go func() { served <- p.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
	})

	return p, ln.Addr().String()
}

// serveOnce accepts one connection on a new loopback listener and runs fn on it; it returns the address.
func serveOnce(t *testing.T, fn func(net.Conn)) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	done := make(chan struct{})

	go func() {
		defer close(done)

		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close() //nolint:errcheck

		fn(c)
	}()

	t.Cleanup(func() {
		ln.Close() //nolint:errcheck
		<-done
	})

	return ln.Addr().String()
}

func TestProxyPassesBytesBothWaysAndHalfCloses(t *testing.T) {
	noLeaks(t)

	payload := make([]byte, 4<<20)
	_, _ = rand.Read(payload)

	// the target reads until the client half-closes, then sends it all back and closes
	target := serveOnce(t, func(c net.Conn) {
		got, err := io.ReadAll(c)
		if err == nil {
			c.Write(got) //nolint:errcheck // the client checks what arrives
		}
	})

	_, addr := startProxy(t, target, 20*time.Millisecond)

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)

	defer c.Close() //nolint:errcheck

	_, err = c.Write(payload)
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite()) // a TCP dial

	back, err := io.ReadAll(c)
	require.NoError(t, err)
	require.True(t, bytes.Equal(payload, back), "got %d bytes back, not the %d sent", len(back), len(payload))
}

func TestProxyCutAfterClosesMidTransferOnce(t *testing.T) {
	noLeaks(t)

	const (
		total   = 32 << 20
		cutAt   = 1 << 20
		segment = 64 << 10
	)

	// the target sends total bytes, then holds the connection until the proxy closes it
	send := func(c net.Conn) {
		if _, err := io.CopyN(c, rand.Reader, total); err == nil {
			io.Copy(io.Discard, c) //nolint:errcheck
		}
	}

	first := serveOnce(t, send)
	p, addr := startProxy(t, first, 0)
	p.CutAfter(cutAt)

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)

	defer c.Close() //nolint:errcheck

	n, _ := io.Copy(io.Discard, c) // ends when the proxy cuts the connection

	require.Equal(t, 1, p.Cuts())
	require.GreaterOrEqual(t, p.Forwarded(), int64(cutAt))
	require.LessOrEqual(t, n, int64(cutAt+segment), "the client got more than was forwarded before the cut")
	require.Less(t, n, int64(total))
}
