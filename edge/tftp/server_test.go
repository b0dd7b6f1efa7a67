package tftp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"testing"
	"time"

	pintftp "github.com/pin/tftp/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/tftp"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startServer(t *testing.T, catalog *bootfiles.Catalog) string {
	t.Helper()

	cfg := tftp.Default()
	cfg.Timeout = 500 * time.Millisecond

	return startServerWith(t, cfg, catalog)
}

func startServerWith(t *testing.T, cfg tftp.Config, catalog *bootfiles.Catalog) string {
	t.Helper()

	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)

	srv, err := tftp.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), catalog, tftp.Deps{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, conn) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return conn.LocalAddr().String()
}

func fetch(t *testing.T, addr, name string, blksize int) ([]byte, int64, error) {
	t.Helper()

	c, err := pintftp.NewClient(addr)
	require.NoError(t, err)
	c.SetTimeout(time.Second)
	c.SetRetries(2)
	c.RequestTSize(true)

	if blksize > 0 {
		c.SetBlockSize(blksize)
	}

	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, 0, err
	}

	size, _ := wt.(pintftp.IncomingTransfer).Size()

	var buf bytes.Buffer
	_, err = wt.WriteTo(&buf)

	return buf.Bytes(), size, err
}

func TestServeFiles(t *testing.T) {
	data := make([]byte, 300_000)
	_, err := rand.Read(data)
	require.NoError(t, err)

	addr := startServer(t, bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": data, "undionly.kpxe": []byte("tiny")}))

	for _, tc := range []struct {
		name    string
		file    string
		blksize int
		want    []byte
	}{
		{name: "default blksize", file: "ipxe.efi", want: data},
		{name: "blksize 1468", file: "ipxe.efi", blksize: 1468, want: data},
		{name: "blksize larger than granted", file: "ipxe.efi", blksize: 65464, want: data},
		{name: "leading slash", file: "/undionly.kpxe", blksize: 1468, want: []byte("tiny")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, size, err := fetch(t, addr, tc.file, tc.blksize)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, int64(len(tc.want)), size, "tsize")
		})
	}
}

func TestRefusals(t *testing.T) {
	addr := startServer(t, bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": []byte("x")}))

	for _, name := range []string{"missing.efi", "../etc/passwd", "/../../etc/passwd", "a/./b", "..", "x\\..\\y"} {
		t.Run(name, func(t *testing.T) {
			// A client that would wait 5 s for an answer: an error back in well under that is the server's
			// error packet, whatever the machine's load.
			c, err := pintftp.NewClient(addr)
			require.NoError(t, err)
			c.SetTimeout(5 * time.Second)
			c.SetRetries(0)

			start := time.Now()
			_, err = c.Receive(name, "octet")
			require.Error(t, err)
			require.Less(t, time.Since(start), 4*time.Second, "refused with an error packet, not by timeout")
		})
	}
}

// BenchmarkFetch1MiB fetches a 1 MiB file at blksize 1468 over loopback, as a ROM would (tsize asked).
func BenchmarkFetch1MiB(b *testing.B) {
	data := make([]byte, 1<<20)
	_, err := rand.Read(data)
	require.NoError(b, err)

	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(b, err)

	cfg := tftp.Default()
	cfg.RequestRatePerSource = 1_000_000 // fetches back to back from one address

	srv, err := tftp.New(cfg, zap.NewNop(), bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": data}), tftp.Deps{})
	require.NoError(b, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, conn) }()

	b.Cleanup(func() {
		cancel()
		require.NoError(b, <-done)
	})

	b.SetBytes(int64(len(data)))

	for b.Loop() {
		c, err := pintftp.NewClient(conn.LocalAddr().String())
		require.NoError(b, err)
		c.SetTimeout(time.Second)
		c.SetBlockSize(1468)
		c.RequestTSize(true)

		wt, err := c.Receive("ipxe.efi", "octet")
		require.NoError(b, err)

		var buf bytes.Buffer

		_, err = wt.WriteTo(&buf)
		require.NoError(b, err)
		require.Equal(b, len(data), buf.Len())
	}
}

// TestRepeatedFinalAcknowledgements sends the last block's acknowledgement again and again while the transfer
// ends. pin/tftp's single-port read loop hands a datagram to a transfer's inbox after it has let go of the
// lock that the transfer's end takes to close that inbox: a datagram handed over at that moment is a send on
// a closed channel, which panics (and the race detector reports). The filter hands a transfer nothing once
// the library has begun to end it.
func TestRepeatedFinalAcknowledgements(t *testing.T) {
	cfg := tftp.Default()
	cfg.Timeout = 500 * time.Millisecond
	cfg.RequestRatePerSource = 1000 // one address sends every request

	addr := startServerWith(t, cfg, bootfiles.NewCatalog(map[string][]byte{"undionly.kpxe": []byte("tiny")}))
	to, err := net.ResolveUDPAddr("udp4", addr)
	require.NoError(t, err)

	rrq := append([]byte{0, 1}, "undionly.kpxe\x00octet\x00"...)
	ack := []byte{0, 4, 0, 1}

	for i := range 40 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)

		_, err = c.WriteToUDP(rrq, to)
		require.NoError(t, err)

		buf := make([]byte, 600)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, _, err := c.ReadFromUDP(buf)
		require.NoError(t, err, "transfer %d", i)
		require.Equal(t, append([]byte{0, 3, 0, 1}, "tiny"...), buf[:n], "transfer %d", i)

		for range 200 {
			_, err = c.WriteToUDP(ack, to)
			require.NoError(t, err)
		}

		require.NoError(t, c.Close())
	}

	// The server still serves (a panic would have ended the test binary before this).
	got, _, err := fetch(t, addr, "undionly.kpxe", 0)
	require.NoError(t, err)
	require.Equal(t, []byte("tiny"), got)
}
