package dhcp_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type seenRecorder struct {
	mu   sync.Mutex
	seen []dhcp.Seen
}

func (r *seenRecorder) DHCPSeen(s dhcp.Seen) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.seen = append(r.seen, s)
}

func (r *seenRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return len(r.seen)
}

type serverEnv struct {
	srv     *dhcp.Server
	reg     *prometheus.Registry
	dhcp    net.PacketConn
	pxe     net.PacketConn
	client  *net.UDPConn
	relay   *net.UDPConn
	seen    *seenRecorder
	cancel  context.CancelFunc
	stopped chan error
}

func listenLoopback(t *testing.T) *net.UDPConn {
	t.Helper()

	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	return c
}

func startServer(t *testing.T, mutate func(*dhcp.Config)) *serverEnv {
	t.Helper()

	env := &serverEnv{reg: prometheus.NewRegistry(), seen: &seenRecorder{}, stopped: make(chan error, 1)}
	env.dhcp = listenLoopback(t)
	env.pxe = listenLoopback(t)
	env.client = listenLoopback(t)
	env.relay = listenLoopback(t)

	cfg := dhcp.Default()
	cfg.ServerIP = "127.0.0.1"
	cfg.HTTPPort = 8080
	cfg.RelayPort = env.relay.LocalAddr().(*net.UDPAddr).Port

	if mutate != nil {
		mutate(&cfg)
	}

	srv, err := dhcp.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), dhcp.Deps{Registerer: env.reg, Observer: env.seen})
	require.NoError(t, err)
	env.srv = srv

	ctx, cancel := context.WithCancel(context.Background())
	env.cancel = cancel

	go func() { env.stopped <- srv.Serve(ctx, env.dhcp, env.pxe) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-env.stopped)
	})

	return env
}

func readReply(t *testing.T, c *net.UDPConn) *dhcpv4.DHCPv4 {
	t.Helper()

	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))

	buf := make([]byte, 1500)
	n, _, err := c.ReadFrom(buf)
	require.NoError(t, err)

	r, err := dhcpv4.FromBytes(buf[:n])
	require.NoError(t, err)

	return r
}

func TestServerRelayedDiscoverAndPXERequest(t *testing.T) {
	env := startServer(t, nil)

	// A relayed DISCOVER is answered to the relay (giaddr) on the relay port.
	disc := request(t, dhcpv4.MessageTypeDiscover, arch(7), dhcpv4.WithGatewayIP(net.IPv4(127, 0, 0, 1)))
	_, err := env.relay.WriteTo(disc, env.dhcp.LocalAddr())
	require.NoError(t, err)

	offer := readReply(t, env.relay)
	require.Equal(t, dhcpv4.MessageTypeOffer, offer.MessageType())
	require.Equal(t, "ipxe.efi", offer.BootFileName)

	// The 4011 REQUEST is answered to the client itself.
	req := request(t, dhcpv4.MessageTypeRequest, arch(7), dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)))
	_, err = env.client.WriteTo(req, env.pxe.LocalAddr())
	require.NoError(t, err)

	ack := readReply(t, env.client)
	require.Equal(t, dhcpv4.MessageTypeAck, ack.MessageType())

	// The server answers first and counts (and reports) after, so the counters may trail the reply a moment.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(env.srv.RepliesCounter("dhcp", "uefi-x86"))+testutil.ToFloat64(env.srv.RepliesCounter("pxe", "uefi-x86")) == 2 && env.seen.count() >= 1
	},
		5*time.Second, time.Millisecond)
	require.InDelta(t, 1, testutil.ToFloat64(env.srv.RepliesCounter("dhcp", "uefi-x86")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(env.srv.RepliesCounter("pxe", "uefi-x86")), 0)

	// Same client, same class, within a minute: reported once.
	require.Never(t, func() bool { return env.seen.count() > 1 }, 200*time.Millisecond, 10*time.Millisecond)
	require.Equal(t, 1, env.seen.count())
}

func TestServerJunkFloodFromOneMACDoesNotStarveOthers(t *testing.T) {
	env := startServer(t, func(c *dhcp.Config) { c.RateBurst = 5; c.RatePerMAC = 1 })

	// The flooding MAC sends until the server has rate limited 50 of its requests. It sends in small
	// batches: on a busy machine the kernel's socket buffer drops what a slow reader has not taken yet,
	// so a fixed count proves nothing about how many the server saw.
	junk := request(t, dhcpv4.MessageTypeDiscover) // not PXE: no option 93
	floodStart := time.Now()

	require.Eventually(t, func() bool {
		for range 20 {
			if _, err := env.relay.WriteTo(junk, env.dhcp.LocalAddr()); err != nil {
				return false
			}
		}

		return testutil.ToFloat64(env.srv.DropsCounter(dhcp.DropRateLimited)) >= 50
	}, 20*time.Second, 10*time.Millisecond)

	truncated := []byte{1, 1, 6}

	// Another client is still answered. It retransmits as a real one does: the flood may also have
	// filled the kernel's socket buffer, which drops datagrams before the server sees them.
	other := net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}
	good := request(t, dhcpv4.MessageTypeDiscover, arch(0), dhcpv4.WithHwAddr(other), dhcpv4.WithGatewayIP(net.IPv4(127, 0, 0, 1)))

	require.Eventually(t, func() bool {
		for _, p := range [][]byte{truncated, good} {
			if _, err := env.relay.WriteTo(p, env.dhcp.LocalAddr()); err != nil {
				return false
			}
		}

		buf := make([]byte, 1500)
		for {
			if err := env.relay.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
				return false
			}

			n, _, err := env.relay.ReadFrom(buf)
			if err != nil {
				return false
			}

			if r, err := dhcpv4.FromBytes(buf[:n]); err == nil && r.ClientHWAddr.String() == other.String() {
				return true
			}
		}
	}, 10*time.Second, 10*time.Millisecond)

	// The truncated packets were dropped as malformed. The flooding MAC got its burst (5) through, dropped
	// as non-PXE, and then one a second, no more: everything else it sent was rate limited.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(env.srv.DropsCounter(dhcp.DropMalformed)) >= 1
	}, 5*time.Second, 10*time.Millisecond)

	allowed := 5 + time.Since(floodStart).Seconds()*1 + 1
	require.LessOrEqual(t, testutil.ToFloat64(env.srv.DropsCounter(dhcp.DropNotPXE)), allowed)
}

func TestNewNothingBootable(t *testing.T) {
	t.Parallel()

	cfg := dhcp.Default()
	cfg.ServerIP = "10.0.0.1"

	_, err := dhcp.New(cfg, zaptest.NewLogger(t), dhcp.Deps{Bootable: func(string) bool { return false }})
	require.ErrorIs(t, err, dhcp.ErrNothingBootable)

	srv, err := dhcp.New(cfg, zaptest.NewLogger(t), dhcp.Deps{Bootable: func(n string) bool { return n == "undionly.kpxe" }})
	require.NoError(t, err)
	require.Equal(t, []dhcp.Firmware{dhcp.FirmwareBIOS}, srv.BootableFirmware())
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		mutate func(*dhcp.Config)
		ok     bool
	}{
		{name: "default with server ip", mutate: func(c *dhcp.Config) { c.ServerIP = "10.0.0.1" }, ok: true},
		{name: "default with interface", mutate: func(c *dhcp.Config) { c.Interface = "eth0" }, ok: true},
		{name: "neither", mutate: func(*dhcp.Config) {}},
		{name: "ipv6 server", mutate: func(c *dhcp.Config) { c.ServerIP = "fd00::1" }},
		{name: "zero workers", mutate: func(c *dhcp.Config) { c.ServerIP = "10.0.0.1"; c.Workers = 0 }},
		{name: "no files", mutate: func(c *dhcp.Config) { c.ServerIP = "10.0.0.1"; c.Files = dhcp.BootFiles{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			c := dhcp.Default()
			tc.mutate(&c)

			if tc.ok {
				require.NoError(t, c.Validate())
			} else {
				require.Error(t, c.Validate())
			}
		})
	}
}

// A machine offered nothing for a reason of its own (here: it enforces Secure Boot and the site has no signed
// image) is reported with the reason, for its timeline, once per minute like an answered one; the drop is
// counted by name.
func TestServerReportsMachineNotAnswered(t *testing.T) {
	env := startServer(t, func(c *dhcp.Config) { c.Files.SecureBoot = []string{"*"} })

	disc := request(t, dhcpv4.MessageTypeDiscover, arch(7), dhcpv4.WithGatewayIP(net.IPv4(127, 0, 0, 1)))

	for range 3 {
		_, err := env.relay.WriteTo(disc, env.dhcp.LocalAddr())
		require.NoError(t, err)
	}

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(env.srv.DropsCounter(dhcp.DropNoSignedFile)) == 3 && env.seen.count() == 1
	}, 5*time.Second, time.Millisecond)

	env.seen.mu.Lock()
	got := env.seen.seen[0]
	env.seen.mu.Unlock()

	require.Equal(t, dhcp.DropNoSignedFile, got.NotAnswered)
	require.Equal(t, testMAC.String(), got.MAC.String())
	require.Never(t, func() bool { return env.seen.count() > 1 }, 200*time.Millisecond, 10*time.Millisecond, "reported once a minute")
}
