package limits_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/edge/limits"
)

// serve runs an http.Server on a Listener over 127.0.0.1 with lim and returns its address.
func serve(t *testing.T, lim *limits.Limiter, h http.Handler, readHeaderTimeout time.Duration) (string, *observer.ObservedLogs) {
	t.Helper()

	core, logs := observer.New(zapcore.DebugLevel)
	rl := limits.NewRejectLog(zap.New(core), "http connection refused", time.Hour, nil)

	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ln := limits.NewListener(raw, lim, rl, map[limits.Reason]string{limits.PerSource: "raise --x"})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ConnState: limits.ConnState}

	done := make(chan error, 1)

	go func() { done <- srv.Serve(ln) }()

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()

		if srv.Shutdown(ctx) != nil {
			srv.Close() //nolint:errcheck
		}

		require.ErrorIs(t, <-done, http.ErrServerClosed)
		rl.Flush()
	})

	return raw.Addr().String(), logs
}

func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}

	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	return c
}

// closedByServer reports whether the server closed c (EOF or reset) within the deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))

	_, err := c.Read(make([]byte, 1))

	var ne net.Error

	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}

// refusedAtOnce dials addr from local and reports whether the server reset or closed the connection at once
// (on loopback the reset can even beat connect's return).
func refusedAtOnce(t *testing.T, local, addr string) bool {
	t.Helper()

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}

	c, err := d.Dial("tcp", addr)
	if err != nil {
		return errors.Is(err, syscall.ECONNRESET)
	}

	defer c.Close()

	return closedByServer(c, 5*time.Second)
}

func get(t *testing.T, local, addr, path string) (*http.Response, error) {
	t.Helper()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext,
	}}
	t.Cleanup(client.CloseIdleConnections)

	return client.Get("http://" + addr + path)
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

// hold answers with one byte and keeps the response open until the client goes or release is closed.
func hold(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/hold" {
			_, _ = io.WriteString(w, "ok")

			return
		}

		_, _ = io.WriteString(w, "x")
		w.(http.Flusher).Flush()

		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
}

func TestListenerPerSource(t *testing.T) {
	t.Parallel()

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })

	lim := limits.New(limits.Config{Total: 100, PerSource: 2})
	addr, logs := serve(t, lim, hold(release), time.Minute)

	// Two connections in the middle of a response: written to, so not evictable.
	for range 2 {
		c := dialFrom(t, "127.0.0.10", addr)
		_, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		_, err = http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
	}

	require.Equal(t, 2, lim.Held(netip.MustParseAddr("127.0.0.10")))

	// The third from that address is closed at once, before the server reads a byte.
	require.True(t, refusedAtOnce(t, "127.0.0.10", addr), "over-limit connection left open")

	// Another address is served.
	resp, err := get(t, "127.0.0.11", addr, "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.Equal(t, int64(1), lim.Stats().Refused[limits.PerSource])
	require.Eventually(t, func() bool { return logs.Len() == 1 }, 5*time.Second, time.Millisecond)

	m := logs.All()[0].ContextMap()
	require.Equal(t, "per_source", m["reason"])
	require.Equal(t, "127.0.0.10", m["remote"])
	require.Equal(t, "raise --x", m["hint"])
}

func TestListenerSlowlorisIsEvictedForARealClient(t *testing.T) {
	t.Parallel()

	lim := limits.New(limits.Config{Total: 20, PerSource: 5})
	addr, _ := serve(t, lim, ok, time.Minute)

	// Slow clients from four addresses fill the total bound with half-sent headers.
	var slow []net.Conn

	for i := range 20 {
		c := dialFrom(t, []string{"127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"}[i%4], addr)
		_, err := io.WriteString(c, "GET / HTTP/1.1\r\nX-Slow: ")
		require.NoError(t, err)

		slow = append(slow, c)
	}

	require.Eventually(t, func() bool { return lim.Stats().Held == 20 }, 5*time.Second, time.Millisecond)

	// A real client still gets its answer: the oldest slow connection made room.
	resp, err := get(t, "127.0.0.2", addr, "/")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "ok", string(body))

	require.True(t, closedByServer(slow[0], 5*time.Second), "the oldest slow connection was not evicted")
	require.Equal(t, int64(1), lim.Stats().Evicted[limits.Total])
	require.LessOrEqual(t, lim.Stats().Peak, 20)
}

func TestListenerIdleKeepAliveIsEvictable(t *testing.T) {
	t.Parallel()

	lim := limits.New(limits.Config{Total: 1})
	addr, _ := serve(t, lim, ok, time.Minute)

	idle := dialFrom(t, "127.0.0.20", addr)
	_, err := io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	require.NoError(t, err)
	resp.Body.Close()

	// Written to, then idle: evictable again.
	require.Eventually(t, func() bool { return lim.Stats().Evictable == 1 }, 5*time.Second, time.Millisecond)

	resp, err = get(t, "127.0.0.21", addr, "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, closedByServer(idle, 5*time.Second))
}

func TestListenerReadHeaderTimeoutFreesSlowClients(t *testing.T) {
	t.Parallel()

	lim := limits.New(limits.Config{Total: 10})
	addr, _ := serve(t, lim, ok, 200*time.Millisecond)

	c := dialFrom(t, "127.0.0.30", addr)
	_, err := io.WriteString(c, "GET / HTTP/1.1\r\n")
	require.NoError(t, err)

	require.True(t, closedByServer(c, 5*time.Second), "the read-header timeout did not end a slow client")
	require.Eventually(t, func() bool { return lim.Stats().Held == 0 }, 5*time.Second, time.Millisecond)
}

func TestListenerKeepsSendfile(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	data := make([]byte, 1<<20)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big"), data, 0o644))

	lim := limits.New(limits.Config{Total: 10})
	addr, _ := serve(t, lim, http.FileServer(http.Dir(dir)), time.Minute)

	resp, err := get(t, "127.0.0.40", addr, "/big")
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, int64(len(data)), n)

	// The wrapped connection still offers the ReaderFrom that carries sendfile.
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ln := limits.NewListener(raw, limits.New(limits.Config{}), limits.NewRejectLog(zap.NewNop(), "x", 0, nil), nil)
	defer ln.Close()

	go func() {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err == nil {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}
	}()

	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()

	_, isReaderFrom := c.(io.ReaderFrom)
	require.True(t, isReaderFrom)
}
