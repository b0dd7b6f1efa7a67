package dhcp_test

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// silentProber is a segment where no host answers: each probe waits out its deadline, as an ARP probe of a
// free address does. It counts the probes and the most in flight at once.
type silentProber struct {
	mu             sync.Mutex
	inFlight, most int
	probed         map[netip.Addr]bool
}

func (p *silentProber) Probe(ctx context.Context, ip netip.Addr) (net.HardwareAddr, error) {
	p.mu.Lock()
	p.inFlight++
	p.most = max(p.most, p.inFlight)
	p.probed[ip] = true
	p.mu.Unlock()

	<-ctx.Done()

	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()

	return nil, nil
}

func (p *silentProber) counts() (probed, most int) {
	p.mu.Lock()
	defer p.mu.Unlock()

	return len(p.probed), p.most
}

// TestDiscoverStormProbesInParallel: a storm of new clients in full mode, each DISCOVER waiting for the probe
// of its address, holds no worker for a probe: the probes run side by side, many more at once than there are
// workers (they used to run one per worker, 4 at once, capping a storm at about 13 offers a second).
func TestDiscoverStormProbesInParallel(t *testing.T) {
	const clients = 40

	probe := &silentProber{probed: map[netip.Addr]bool{}}

	leases, err := dhcp.OpenLeases(t.TempDir(), zap.NewNop())
	require.NoError(t, err)

	server := listenLoopback(t)
	client := listenLoopback(t)

	cfg := dhcp.Default()
	cfg.ServerIP = "127.0.0.1"

	site := &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "127.0.0.0/16", PoolStart: "127.0.1.1", PoolEnd: "127.0.4.250", // a quarter of the pool: 64 offers pending
		LeaseSeconds: 600,
	}

	srv, err := dhcp.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), dhcp.Deps{Site: fixedSite{site}, Leases: leases, Probe: probe})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)

	go func() { stopped <- srv.Serve(ctx, server, nil) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})

	for i := range clients {
		mac := net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x00, byte(i)}
		disc, err := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover),
			dhcpv4.WithTransactionID(dhcpv4.TransactionID{9, 9, 0, byte(i)}))
		require.NoError(t, err)

		_, err = client.WriteTo(disc.ToBytes(), server.LocalAddr())
		require.NoError(t, err)
	}

	// Every client's address is probed (each new client is offered its own), and the probes overlapped.
	deadline := time.Now().Add(30 * time.Second)
	for probed, _ := probe.counts(); probed < clients; probed, _ = probe.counts() {
		require.True(t, time.Now().Before(deadline), "%d of %d DISCOVERs had their address probed", probed, clients)
		time.Sleep(5 * time.Millisecond) // polling the prober's count
	}

	_, most := probe.counts()
	require.Greater(t, most, 2*cfg.Workers, "at most %d probes at once with %d workers", most, cfg.Workers)
	t.Logf("%d DISCOVERs: %d probes at once at most (%d workers)", clients, most, cfg.Workers)
}
