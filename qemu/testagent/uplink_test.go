package testagent_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/tunnel"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	"github.com/outpost-metal/outpost/qemu/testagent"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// logSink collects every log line of a run (all components, debug level) to scan it afterwards.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.Write(p)
}

func (s *logSink) Sync() error { return nil }

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.String()
}

func newLogger(t *testing.T) (*zap.Logger, *logSink) {
	t.Helper()

	sink := &logSink{}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), sink, zap.DebugLevel)

	t.Cleanup(func() {
		if t.Failed() {
			t.Log(sink.String())
		}
	})

	return zap.New(core), sink
}

type tunnelEvents struct {
	mu             sync.Mutex
	opened, closed int
}

func (e *tunnelEvents) TunnelOpened(tunnel.Event) { e.mu.Lock(); e.opened++; e.mu.Unlock() }
func (e *tunnelEvents) TunnelClosed(tunnel.Event) { e.mu.Lock(); e.closed++; e.mu.Unlock() }

func (e *tunnelEvents) counts() (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.opened, e.closed
}

type locator map[string]string

func (l locator) SiteOf(id string) (string, bool) { s, ok := l[id]; return s, ok }

const (
	siteA        = "site-a"
	otherMachine = "11111111-2222-4333-8444-555555555555"
	bmcUser      = "outpost"
	bmcPassword  = "Zx9-secret-Qw7!" // provisioned through the agent, then used for the BMC
)

// site is an edge with its tunnel endpoint and BMC service, connected to a controller over a real uplink.
type site struct {
	ctrl       *linklab.Controller
	tunnel     *tunnel.Server
	tunnelAddr string
	events     *tunnelEvents
	access     *machineaccess.Client
}

func startSite(t testing.TB, log *zap.Logger, mutate func(*bmc.Config), now func() time.Time) *site {
	t.Helper()

	ev := &tunnelEvents{}
	tsrv := tunnel.New(tunnel.Options{Logger: log, Events: ev, Binding: tunnel.BindOff})

	cfg := bmc.Default()
	cfg.CallTimeout = 5 * time.Second
	cfg.RatePerSecond, cfg.Burst = 100, 10

	if mutate != nil {
		mutate(&cfg)
	}

	mgr, err := bmc.New(cfg, log, now)
	require.NoError(t, err)
	t.Cleanup(mgr.Close)

	ctrl := linklab.StartController(t, linklab.ControllerOptions{Logger: log})
	linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, siteA, sites.TokenOptions{}), linklab.EdgeOptions{Options: edgeuplink.Options{
		Logger:        log,
		Register:      []func(grpc.ServiceRegistrar){bmc.NewService(mgr).Register},
		ServerOptions: []grpc.ServerOption{tsrv.ServerOption()},
	}})
	ctrl.WaitConnected(t, siteA)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- tsrv.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		<-done
	})

	return &site{
		ctrl: ctrl, tunnel: tsrv, tunnelAddr: ln.Addr().String(), events: ev,
		access: machineaccess.New(ctrl.Server.Conn, locator{machineID: siteA, otherMachine: "site-b"}),
	}
}

func startAgent(t testing.TB, s *site, log *zap.Logger, cfg testagent.Config) (stop func()) {
	t.Helper()

	cfg.Endpoint, cfg.MachineID, cfg.Logger = s.tunnelAddr, machineID, log

	agent, err := testagent.New(cfg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- agent.Run(ctx) }()

	var once sync.Once

	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)

	require.Eventually(t, func() bool { return s.tunnel.Connected(machineID) }, 10*time.Second, 5*time.Millisecond)

	return stop
}

// TestOverUplink drives the agent and the BMC of a machine from the controller through a real
// uplink, then scans every log line of the run for the BMC password.
func TestOverUplink(t *testing.T) {
	log, logs := newLogger(t)
	s := startSite(t, log, nil, nil)

	dir := t.TempDir()
	disk := filepath.Join(dir, "sda")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0x5A}, 2<<20), 0o600))

	ipmiTable := &testagent.IPMI{Address: "127.0.0.1", Port: 623}
	stopAgent := startAgent(t, s, log, testagent.Config{Disks: []string{disk}, IPMI: ipmiTable})

	agent := s.access.Agent(siteA, machineID)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// Agent calls, controller -> uplink -> edge proxy -> tunnel -> agent.
	_, err := agent.Hello(ctx, &agentpb.HelloRequest{})
	require.NoError(t, err)

	pm, err := agent.GetPowerManagement(ctx, &agentpb.GetPowerManagementRequest{Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: bmcUser}})
	require.NoError(t, err)
	require.False(t, pm.GetIpmi().GetUserExists())

	_, err = agent.SetPowerManagement(ctx, &agentpb.SetPowerManagementRequest{Ipmi: &agentpb.SetPowerManagementRequest_IPMI{Username: bmcUser, Password: bmcPassword}})
	require.NoError(t, err)

	pm, err = agent.GetPowerManagement(ctx, &agentpb.GetPowerManagementRequest{Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: bmcUser}})
	require.NoError(t, err)
	require.True(t, pm.GetIpmi().GetUserExists())

	_, err = agent.WipeDisks(ctx, &agentpb.WipeDisksRequest{Zeroes: true})
	require.NoError(t, err)

	data, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 2<<20), data, "disk zeroed through the uplink")

	// A machine of another site is refused by the controller before the call leaves.
	_, err = s.access.Agent(siteA, otherMachine).Hello(ctx, &agentpb.HelloRequest{})
	require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, machineaccess.ErrWrongSite.Error())

	_, err = s.access.BMC(siteA, otherMachine, nil).PowerStatus(ctx)
	require.Equal(t, codes.Aborted, status.Code(err))

	// The agent disconnects: Unavailable within a second, and a close event.
	stopAgent()

	require.Eventually(t, func() bool {
		_, err := agent.Hello(ctx, &agentpb.HelloRequest{})

		return status.Code(err) == codes.Unavailable
	}, time.Second, 10*time.Millisecond)

	// grpctunnel reports the close after it has dropped the channel, so the event may trail the
	// Unavailable answer by a moment.
	require.Eventually(t, func() bool { _, closed := s.events.counts(); return closed == 1 }, 5*time.Second, 5*time.Millisecond)

	// Reconnect restores calls.
	startAgent(t, s, log, testagent.Config{Disks: []string{disk}, IPMI: ipmiTable})

	_, err = agent.Hello(ctx, &agentpb.HelloRequest{})
	require.NoError(t, err)

	require.Eventually(t, func() bool { opened, _ := s.events.counts(); return opened == 2 }, 5*time.Second, 5*time.Millisecond)

	opened, closed := s.events.counts()
	require.Equal(t, [2]int{2, 1}, [2]int{opened, closed}, "exactly one more open and no extra close")

	// The BMC, with the credentials provisioned through the agent: over the uplink, both protocols.
	for _, tc := range []struct {
		name     string
		protocol bmcpb.Protocol
	}{
		{name: "ipmi", protocol: bmcpb.Protocol_PROTOCOL_IPMI},
		{name: "redfish", protocol: bmcpb.Protocol_PROTOCOL_AUTO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := vbmc.NewChassis()
			port := startIPMI(t, ch, bmcUser, bmcPassword)
			rf := startRedfish(t, ch, bmcUser, bmcPassword)

			target := &bmcpb.Target{Host: "127.0.0.1", IpmiPort: uint32(port), RedfishEndpoint: rf, Protocol: tc.protocol, Username: bmcUser, Password: bmcPassword}
			b := s.access.BMC(siteA, machineID, target)

			on, err := b.PowerStatus(ctx)
			require.NoError(t, err)
			require.False(t, on)

			for _, mode := range []bmcpb.BootMode{bmcpb.BootMode_BOOT_MODE_BIOS, bmcpb.BootMode_BOOT_MODE_UEFI} {
				require.NoError(t, b.SetPXEOnce(ctx, mode))

				got, err := b.GetBootOverride(ctx)
				require.NoError(t, err)
				require.True(t, got.GetSet())
				require.True(t, got.GetPxe())
				require.Equal(t, mode, got.GetMode())
			}

			require.NoError(t, b.Power(ctx, machineaccess.PowerOn))
			require.Equal(t, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI}, ch.Boots()[0])
			require.NoError(t, b.Power(ctx, machineaccess.PowerCycle))
			require.Len(t, ch.Boots(), 2)
			require.NoError(t, b.ClearBootOverride(ctx))
			require.NoError(t, b.Power(ctx, machineaccess.PowerOff))
			require.False(t, ch.PowerState())

			// Wrong password: a clear error that does not echo it.
			bad := s.access.BMC(siteA, machineID, &bmcpb.Target{Host: "127.0.0.1", IpmiPort: uint32(port), Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Username: bmcUser, Password: "not-" + bmcPassword})
			_, err = bad.PowerStatus(ctx)
			require.Error(t, err)
			require.NotContains(t, err.Error(), bmcPassword)
		})
	}

	// Not a single log line of the run contains the password.
	all := logs.String()
	require.NotEmpty(t, all)
	require.Contains(t, all, "agent tunnel opened", "the scan saw the tunnel logs")
	require.Contains(t, all, "bmc operation failed", "the scan saw the bmc logs")
	require.False(t, strings.Contains(all, bmcPassword), "password found in the logs")
}

func startIPMI(t testing.TB, ch *vbmc.Chassis, user, password string) int {
	t.Helper()

	b, err := vbmc.NewIPMI(ch, user, password)
	require.NoError(t, err)

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- b.Serve(ctx, conn) }()

	t.Cleanup(func() { cancel(); <-done })

	return conn.LocalAddr().(*net.UDPAddr).Port
}

func startRedfish(t testing.TB, ch *vbmc.Chassis, user, password string) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	srv := &httpServer{}
	srv.start(ln, vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password}))
	t.Cleanup(srv.stop)

	url := "http://" + ln.Addr().String()

	redfishServers.Store(url, srv)

	return url
}

// redfishServers maps a started emulator's URL to its server, for stopRedfish.
var redfishServers sync.Map

func stopRedfish(t testing.TB, url string) {
	t.Helper()

	srv, ok := redfishServers.Load(url)
	require.True(t, ok)
	srv.(*httpServer).stop()
}

// BenchmarkHelloOverUplink compares Hello controller -> uplink -> edge -> tunnel -> agent with a
// direct tunnel call on the edge (p50/p99).
func BenchmarkHelloOverUplink(b *testing.B) {
	log := zap.NewNop()

	s := startSite(b, log, nil, nil)
	startAgent(b, s, log, testagent.Config{})

	for _, bc := range []struct {
		name   string
		client agentpb.AgentServiceClient
		ctx    context.Context
	}{
		{name: "direct-tunnel", client: agentpb.NewAgentServiceClient(s.tunnel.Channel(machineID)),
			ctx: metadata.AppendToOutgoingContext(context.Background(), metal.MetadataKey, machineID)},
		{name: "controller-uplink-edge-tunnel", client: s.access.Agent(siteA, machineID), ctx: context.Background()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)

			for b.Loop() {
				start := time.Now()
				_, err := bc.client.Hello(bc.ctx, &agentpb.HelloRequest{})
				lat = append(lat, time.Since(start))

				if err != nil {
					b.Fatal(err)
				}
			}

			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
		})
	}
}
