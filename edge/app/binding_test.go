package app_test

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/journal"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/nettest"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// TestConfigFetchCannotClaimATunnel runs the edge as its composition root wires it. A host on the site network
// that fetches a switched-off machine's config (answered to anyone: it carries no MAC) and then dials the
// agent tunnel with that machine's ID is refused, so no agent call (SetPowerManagement, WipeDisks) can be
// routed to it, and the refusal goes to the controller; the machine's own next boot (boot.ipxe with its UUID
// and MAC, from its address) binds as before. Its addresses are 127.0.0.11 (the machine) and 127.0.0.21 (the
// other host).
func TestConfigFetchCannotClaimATunnel(t *testing.T) {
	const (
		victim  = "4c4c4544-0042-3510-8052-b4c04f4e4e61"
		bootIP  = "127.0.0.11"
		rogueIP = "127.0.0.21"
	)

	ipxeDir := t.TempDir()
	binary := make([]byte, 1000)
	_, err := rand.Read(binary)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "ipxe.efi"), binary, 0o644))

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.IPXEDir = ipxeDir
	cfg.HTTP.Listen = freeAddr(t, "tcp")
	cfg.APIListen = freeAddr(t, "tcp")
	cfg.TFTP.Listen = freeAddr(t, "udp")
	cfg.Uplink.ControllerAddress = nettest.RefusingAddr(t)
	cfg.Uplink.JoinToken = uplink.JoinToken{SiteID: "lab", Secret: make([]byte, uplink.SecretLen)}.String()

	// the controller's last table, kept in the state directory: the site's join config, served at /config
	table, err := boot.Open(boot.Config{StateDir: cfg.StateDir}, zaptest.NewLogger(t))
	require.NoError(t, err)
	_, err = table.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{Version: 1, Config: []byte("join-config")}}})
	require.NoError(t, err)

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

	open := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return metrics(t, cfg.HTTP.Listen)["outpost_edge_agent_tunnels_open"] == want },
			10*time.Second, 10*time.Millisecond, "tunnels open: want %s", want)
	}

	bootScript := "/ipxe/boot.ipxe?uuid=" + victim + "&mac=52-54-00-00-00-11&arch=x86_64"

	// The machine boots through the edge, its agent connects, and it is switched off (its tunnel goes).
	require.Equal(t, http.StatusOK, getFrom(t, bootIP, cfg.HTTP.Listen, bootScript))

	stopAgent, _ := openTunnelFrom(t, cfg.APIListen, bootIP, victim)
	open("1")
	stopAgent()
	open("0")

	// Another host asks for the machine's config: it is served (any host may ask), and binds nothing.
	require.Equal(t, http.StatusOK, getFrom(t, rogueIP, cfg.HTTP.Listen, "/config?u="+victim))

	stopRogue, rogueDone := openTunnelFrom(t, cfg.APIListen, rogueIP, victim)
	t.Cleanup(stopRogue)

	select {
	case err := <-rogueDone:
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		require.ErrorContains(t, err, "the machine booted from "+bootIP)
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel of the host that fetched the config was not refused")
	}

	require.Equal(t, "1", metrics(t, cfg.HTTP.Listen)[`outpost_edge_agent_tunnels_rejected_total{reason="source_not_boot_address"}`])
	open("0")

	// The machine's own next boot binds as before.
	require.Equal(t, http.StatusOK, getFrom(t, bootIP, cfg.HTTP.Listen, bootScript))

	stopAgent, _ = openTunnelFrom(t, cfg.APIListen, bootIP, victim)
	t.Cleanup(stopAgent)
	open("1")
	stopAgent()
	open("0")
	stop()

	// What the controller hears: the machine's two tunnels, and the other host's refused one, with its address.
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
			tunnels = append(tunnels, at.GetMachineId()+" "+at.GetRemoteIp()+map[bool]string{true: " open", false: " closed"}[at.GetOpen()])
		}

		if r := e.GetTunnelRefused(); r != nil {
			tunnels = append(tunnels, r.GetMachineId()+" "+r.GetRemoteIp()+" refused: "+r.GetReason())
		}
	}

	require.Equal(t, []string{
		victim + " " + bootIP + " open",
		victim + " " + bootIP + " closed",
		victim + " " + rogueIP + " refused: source_not_boot_address",
		victim + " " + bootIP + " open",
		victim + " " + bootIP + " closed",
	}, tunnels)
}

// getFrom asks the edge's HTTP server for path from source address src and returns the status.
func getFrom(t *testing.T, src, httpAddr, path string) int {
	t.Helper()

	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext,
	}}

	resp, err := c.Get("http://" + httpAddr + path)
	require.NoError(t, err)

	defer resp.Body.Close()

	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)

	return resp.StatusCode
}

// openTunnelFrom opens a reverse agent tunnel for machineID from source address src; done gets its end.
func openTunnelFrom(t *testing.T, apiAddr, src, machineID string) (stop func(), done <-chan error) {
	t.Helper()

	conn, err := grpc.NewClient("passthrough:///"+apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext(ctx, "tcp", a)
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

	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			rts.Stop()
			conn.Close() //nolint:errcheck
		}
	}

	return stop, errCh
}
