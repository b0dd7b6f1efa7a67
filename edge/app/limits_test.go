package app_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/nettest"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// freeAddr returns a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T, network string) string {
	t.Helper()

	if network == "udp" {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		require.NoError(t, err)
		defer c.Close()

		return c.LocalAddr().String()
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()

	return ln.Addr().String()
}

func metrics(t *testing.T, httpAddr string) map[string]string {
	t.Helper()

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()

	out := map[string]string{}

	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), " "); ok && !strings.HasPrefix(name, "#") {
			out[name] = value
		}
	}

	return out
}

func openTunnel(t *testing.T, apiAddr, machineID string) (stop func(), done <-chan error) {
	t.Helper()

	conn, err := grpc.NewClient("passthrough:///"+apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}}).DialContext(ctx, "tcp", a)
		}))
	require.NoError(t, err)

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(rts, agentpb.UnimplementedAgentServiceServer{})

	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), metal.MetadataKey, machineID))
	errCh := make(chan error, 1)

	go func() {
		_, err := rts.Serve(ctx)
		errCh <- err
	}()

	stop = func() {
		cancel()
		rts.Stop()
		conn.Close()
	}

	return stop, errCh
}

// TestLimitsReachTheRunningEdge runs the edge as its composition root wires it, with per-source limits of 2
// HTTP connections, 2 TFTP transfers and 1 agent tunnel, and checks each limit acts on real sockets and shows
// in /metrics, and that a refused tunnel leaves no journal event. Its addresses are 127.0.0.9 and 127.0.0.10.
func TestLimitsReachTheRunningEdge(t *testing.T) {
	ipxeDir := t.TempDir()
	binary := make([]byte, 100_000)
	_, err := rand.Read(binary)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "ipxe.efi"), binary, 0o644))

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.IPXEDir = ipxeDir
	cfg.HTTP.Listen = freeAddr(t, "tcp")
	cfg.APIListen = freeAddr(t, "tcp")
	cfg.TFTP.Listen = freeAddr(t, "udp")
	// No controller: the edge keeps trying to enrol in the background, and serves the site meanwhile.
	cfg.Uplink.ControllerAddress = nettest.RefusingAddr(t)
	cfg.Uplink.JoinToken = uplink.JoinToken{SiteID: "lab", Secret: make([]byte, uplink.SecretLen)}.String()
	cfg.HTTP.MaxConnsPerSource = 2
	cfg.TFTP.MaxTransfersPerSource = 2
	cfg.Tunnels.MaxTunnelsPerSource = 1

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)

	go func() { ran <- app.Run(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))) }()

	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-ran)
		}
	}
	t.Cleanup(stop)

	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + cfg.HTTP.Listen + "/healthz")
		if err == nil {
			resp.Body.Close()
		}

		return err == nil
	}, 30*time.Second, 10*time.Millisecond)

	const machineA, machineB = "4c4c4544-0042-3510-8052-b4c04f4e4e31", "4c4c4544-0042-3510-8052-b4c04f4e4e32"

	// Both machines boot from 127.0.0.9 first, as real ones do before their agent connects (the edge may bind
	// a tunnel to that evidence).
	booter := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}}).DialContext,
	}}

	for _, id := range []string{machineA, machineB} {
		resp, err := booter.Get("http://" + cfg.HTTP.Listen + "/ipxe/boot.ipxe?uuid=" + id + "&mac=52-54-00-00-00-09&arch=x86_64")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	// HTTP: a third slow connection from one address makes its own oldest one go.
	var slow []net.Conn

	for range 3 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 10)}}).Dial("tcp", cfg.HTTP.Listen)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "GET /ipxe/init.ipxe HTTP/1.1\r\n")
		require.NoError(t, err)

		slow = append(slow, c)
	}

	require.NoError(t, slow[0].SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = slow[0].Read(make([]byte, 1))
	require.Error(t, err)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the oldest slow connection was not closed")

	// TFTP: a third unacknowledged transfer from one address makes its own oldest one go.
	for range 3 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 9)})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })

		to, err := net.ResolveUDPAddr("udp4", cfg.TFTP.Listen)
		require.NoError(t, err)
		_, err = c.WriteToUDP(append(binary16(1), "ipxe.efi\x00octet\x00"...), to)
		require.NoError(t, err)
	}

	// Tunnels: a second from one address is refused, and not journaled.
	stopA, _ := openTunnel(t, cfg.APIListen, machineA)
	t.Cleanup(stopA)

	require.Eventually(t, func() bool { return metrics(t, cfg.HTTP.Listen)["outpost_edge_agent_tunnels_open"] == "1" }, 10*time.Second, 10*time.Millisecond)

	stopB, doneB := openTunnel(t, cfg.APIListen, machineB)
	t.Cleanup(stopB)

	select {
	case err := <-doneB:
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the second tunnel from one address was not refused")
	}

	require.Eventually(t, func() bool {
		m := metrics(t, cfg.HTTP.Listen)

		return m[`outpost_http_connections_evicted_total{reason="per_source"}`] == "1" &&
			m[`outpost_tftp_transfers_evicted_total{reason="per_source"}`] == "1" &&
			m[`outpost_edge_agent_tunnels_rejected_total{reason="per_source"}`] == "1"
	}, 10*time.Second, 10*time.Millisecond, "limits not seen in /metrics")

	stopA()
	require.Eventually(t, func() bool { return metrics(t, cfg.HTTP.Listen)["outpost_edge_agent_tunnels_open"] == "0" }, 10*time.Second, 10*time.Millisecond)
	stop()

	// The journal holds the open and the close of the one tunnel kept, nothing of the refused one.
	jcfg := journal.Default()
	jcfg.Dir = cfg.StateDir

	j, err := journal.Open(jcfg, zap.NewNop(), journal.Deps{})
	require.NoError(t, err)
	defer j.Close()

	events, err := j.Pending(10_000)
	require.NoError(t, err)

	var tunnels []string

	for _, e := range events {
		if at := e.GetAgentTunnel(); at != nil {
			tunnels = append(tunnels, at.GetMachineId()+map[bool]string{true: " open", false: " closed"}[at.GetOpen()])
		}
	}

	require.Equal(t, []string{machineA + " open", machineA + " closed"}, tunnels)
}

func binary16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
