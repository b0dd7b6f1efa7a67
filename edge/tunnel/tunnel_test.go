package tunnel_test

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const machineA = "4c4c4544-0042-3510-8052-b4c04f4e4e31"

// fakeAgent serves AgentService; the fields let a test see and shape the calls.
type fakeAgent struct {
	agentpb.UnimplementedAgentServiceServer

	mu       sync.Mutex
	users    map[string]string
	wiped    int
	deadline time.Duration
	block    chan struct{} // when set, WipeDisks waits for it (or the call's end)
}

func (f *fakeAgent) Hello(context.Context, *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	return &agentpb.HelloResponse{}, nil
}

func (f *fakeAgent) GetPowerManagement(_ context.Context, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	_, ok := f.users[req.GetIpmi().GetCheckUsername()]

	return &agentpb.GetPowerManagementResponse{Ipmi: &agentpb.GetPowerManagementResponse_IPMI{Address: "10.0.0.9", Port: 623, UserExists: ok}}, nil
}

func (f *fakeAgent) SetPowerManagement(_ context.Context, req *agentpb.SetPowerManagementRequest) (*agentpb.SetPowerManagementResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if f.users == nil {
		f.users = map[string]string{}
	}

	f.users[req.GetIpmi().GetUsername()] = req.GetIpmi().GetPassword()

	return &agentpb.SetPowerManagementResponse{}, nil
}

func (f *fakeAgent) WipeDisks(ctx context.Context, _ *agentpb.WipeDisksRequest) (*agentpb.WipeDisksResponse, error) {
	f.mu.Lock()
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	block := f.block
	f.mu.Unlock()

	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}

	f.mu.Lock()
	f.wiped++
	f.mu.Unlock()

	return &agentpb.WipeDisksResponse{}, nil
}

// events records tunnel events.
type events struct {
	mu             sync.Mutex
	opened, closed []tunnel.Event
}

func (e *events) TunnelOpened(ev tunnel.Event) {
	e.mu.Lock()
	e.opened = append(e.opened, ev)
	e.mu.Unlock()
}
func (e *events) TunnelClosed(ev tunnel.Event) {
	e.mu.Lock()
	e.closed = append(e.closed, ev)
	e.mu.Unlock()
}

func (e *events) counts() (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return len(e.opened), len(e.closed)
}

type book map[metal.ID]netip.Addr

func (b book) SeenAddr(id metal.ID) (netip.Addr, bool) { a, ok := b[id]; return a, ok }

type harness struct {
	srv        *tunnel.Server
	tunnelAddr string
	caller     *grpc.ClientConn // to the proxy, as the controller would be
	events     *events
}

func newHarness(t *testing.T, b tunnel.AddressBook) *harness {
	t.Helper()

	ev := &events{}
	srv := tunnel.New(tunnel.Options{Logger: zaptest.NewLogger(t), Events: ev, Addresses: b, Binding: tunnel.BindOff})

	ctx, cancel := context.WithCancel(context.Background())

	tln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, tln) }()

	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	proxy := grpc.NewServer(srv.ServerOption())

	go proxy.Serve(pln) //nolint:errcheck

	caller, err := grpc.NewClient("passthrough:///"+pln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		caller.Close() //nolint:errcheck
		proxy.Stop()
		cancel()
		require.NoError(t, <-done)
	})

	return &harness{srv: srv, tunnelAddr: tln.Addr().String(), caller: caller, events: ev}
}

// connect opens a reverse tunnel from a fake agent with the given metadata; cancel closes it.
func connect(t *testing.T, addr string, agent agentpb.AgentServiceServer, md ...string) (cancel func(), done <-chan error) {
	t.Helper()

	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(rts, agent)

	ctx, cancelCtx := context.WithCancel(context.Background())
	ctx = metadata.AppendToOutgoingContext(ctx, md...)

	errCh := make(chan error, 1)
	finished := make(chan struct{})

	go func() {
		defer close(finished)

		_, err := rts.Serve(ctx)
		errCh <- err
	}()

	var once sync.Once

	stop := func() {
		once.Do(func() {
			cancelCtx()
			<-finished
			rts.Stop()
			conn.Close() //nolint:errcheck
		})
	}

	t.Cleanup(stop)

	return stop, errCh
}

func machineCtx(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, id)
}

func TestProxyAgentCalls(t *testing.T) {
	t.Parallel()

	h := newHarness(t, book{machineA: netip.MustParseAddr("127.0.0.1")})
	agent := &fakeAgent{}
	connect(t, h.tunnelAddr, agent, metal.MetadataKey, machineA)

	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	client := agentpb.NewAgentServiceClient(h.caller)

	ctx, cancel := context.WithTimeout(machineCtx(t.Context(), machineA), 42*time.Second)
	defer cancel()

	_, err := client.Hello(ctx, &agentpb.HelloRequest{})
	require.NoError(t, err)

	_, err = client.SetPowerManagement(ctx, &agentpb.SetPowerManagementRequest{Ipmi: &agentpb.SetPowerManagementRequest_IPMI{Username: "outpost", Password: "pw"}})
	require.NoError(t, err)

	pm, err := client.GetPowerManagement(ctx, &agentpb.GetPowerManagementRequest{Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: "outpost"}})
	require.NoError(t, err)
	require.True(t, pm.GetIpmi().GetUserExists())
	require.Equal(t, "10.0.0.9", pm.GetIpmi().GetAddress())

	_, err = client.WipeDisks(ctx, &agentpb.WipeDisksRequest{Zeroes: true})
	require.NoError(t, err)

	agent.mu.Lock()
	require.Equal(t, 1, agent.wiped)
	// The caller's deadline reached the agent through the tunnel.
	require.InDelta(t, 42*time.Second, agent.deadline, float64(2*time.Second))
	agent.mu.Unlock()

	// grpctunnel makes the tunnel usable before it reports the open: the event may trail a moment.
	require.Eventually(t, func() bool { o, _ := h.events.counts(); return o == 1 }, 5*time.Second, 5*time.Millisecond)
	h.events.mu.Lock()
	require.Equal(t, machineA, h.events.opened[0].MachineID)
	require.False(t, h.events.opened[0].AddressMismatch)
	h.events.mu.Unlock()
}

func TestProxyDisconnectAndReconnect(t *testing.T) {
	t.Parallel()

	h := newHarness(t, nil)
	agent := &fakeAgent{block: make(chan struct{})}
	stop, _ := connect(t, h.tunnelAddr, agent, metal.MetadataKey, machineA)

	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	client := agentpb.NewAgentServiceClient(h.caller)

	// A call in flight when the agent goes away ends with Unavailable, quickly.
	callErr := make(chan error, 1)

	go func() {
		_, err := client.WipeDisks(machineCtx(context.Background(), machineA), &agentpb.WipeDisksRequest{})
		callErr <- err
	}()

	require.Eventually(t, func() bool {
		agent.mu.Lock()
		defer agent.mu.Unlock()

		return agent.deadline != 0 // the call reached the agent
	}, 5*time.Second, 10*time.Millisecond)

	stop()

	select {
	case err := <-callErr:
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	case <-time.After(3 * time.Second): // it ends in milliseconds; the margin is for a loaded CI machine
		t.Fatal("in-flight call did not end within seconds of the agent disconnecting")
	}

	require.Eventually(t, func() bool { _, c := h.events.counts(); return c == 1 }, 5*time.Second, 5*time.Millisecond)

	// No tunnel: Unavailable at once (no waiting for one to appear).
	start := time.Now()
	_, err := client.Hello(machineCtx(t.Context(), machineA), &agentpb.HelloRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Contains(t, err.Error(), "no agent tunnel")
	require.Less(t, time.Since(start), 3*time.Second)

	// Reconnect restores calls.
	connect(t, h.tunnelAddr, &fakeAgent{}, metal.MetadataKey, machineA)
	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	_, err = client.Hello(machineCtx(t.Context(), machineA), &agentpb.HelloRequest{})
	require.NoError(t, err)

	require.Eventually(t, func() bool { o, _ := h.events.counts(); return o == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Never(t, func() bool { o, _ := h.events.counts(); return o > 2 }, 100*time.Millisecond, 10*time.Millisecond)
}

func TestTunnelBadMachineID(t *testing.T) {
	t.Parallel()

	h := newHarness(t, nil)

	for _, tc := range []struct {
		name string
		md   []string
	}{
		{name: "missing"},
		{name: "empty", md: []string{metal.MetadataKey, ""}},
		{name: "not a uuid", md: []string{metal.MetadataKey, "../../etc/passwd"}},
		{name: "bad hex", md: []string{metal.MetadataKey, "4c4c4544-0042-3510-8052-b4c04f4e4eZZ"}},
		{name: "two values", md: []string{metal.MetadataKey, machineA, metal.MetadataKey, machineA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, done := connect(t, h.tunnelAddr, &fakeAgent{}, tc.md...)

			select {
			case err := <-done:
				require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			case <-time.After(5 * time.Second):
				t.Fatal("malformed tunnel was not refused")
			}
		})
	}

	opened, _ := h.events.counts()
	require.Zero(t, opened)
}

func TestProxyBadCalls(t *testing.T) {
	t.Parallel()

	h := newHarness(t, nil)
	agent := &fakeAgent{block: make(chan struct{})}
	connect(t, h.tunnelAddr, agent, metal.MetadataKey, machineA)
	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	client := agentpb.NewAgentServiceClient(h.caller)

	t.Run("no machine-id", func(t *testing.T) {
		_, err := client.Hello(t.Context(), &agentpb.HelloRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err))
	})

	t.Run("malformed machine-id", func(t *testing.T) {
		_, err := client.Hello(machineCtx(t.Context(), "nope"), &agentpb.HelloRequest{})
		require.Equal(t, codes.InvalidArgument, status.Code(err))
	})

	t.Run("other service", func(t *testing.T) {
		err := h.caller.Invoke(machineCtx(t.Context(), machineA), "/grpc.health.v1.Health/Check", &agentpb.HelloRequest{}, &agentpb.HelloResponse{})
		require.Equal(t, codes.Unimplemented, status.Code(err))
	})

	t.Run("agent never answers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(machineCtx(t.Context(), machineA), 300*time.Millisecond)
		defer cancel()

		start := time.Now()
		_, err := client.WipeDisks(ctx, &agentpb.WipeDisksRequest{})
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		require.Less(t, time.Since(start), 3*time.Second)
	})

	t.Run("caller cancels", func(t *testing.T) {
		ctx, cancel := context.WithCancel(machineCtx(t.Context(), machineA))
		time.AfterFunc(100*time.Millisecond, cancel)

		_, err := client.WipeDisks(ctx, &agentpb.WipeDisksRequest{})
		require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	})

	// The agent still serves after the abandoned calls.
	_, err := client.Hello(machineCtx(t.Context(), machineA), &agentpb.HelloRequest{})
	require.NoError(t, err)
}

func TestTunnelAddressMismatch(t *testing.T) {
	t.Parallel()

	h := newHarness(t, book{machineA: netip.MustParseAddr("192.0.2.7")})
	connect(t, h.tunnelAddr, &fakeAgent{}, metal.MetadataKey, "4C4C4544-0042-3510-8052-B4C04F4E4E31")

	require.Eventually(t, func() bool { o, _ := h.events.counts(); return o == 1 }, 5*time.Second, 10*time.Millisecond)

	h.events.mu.Lock()
	defer h.events.mu.Unlock()

	ev := h.events.opened[0]
	require.Equal(t, machineA, ev.MachineID, "machine-id is normalized to lower case")
	require.True(t, ev.AddressMismatch)
	require.Equal(t, "192.0.2.7", ev.SeenAddr.String())
	require.Equal(t, "127.0.0.1", ev.RemoteAddr.Addr().String())
}

func TestParseMachineID(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, in, want string
		ok             bool
	}{
		{name: "lower", in: machineA, want: machineA, ok: true},
		{name: "upper", in: "4C4C4544-0042-3510-8052-B4C04F4E4E31", want: machineA, ok: true},
		{name: "short", in: "4c4c4544"},
		{name: "no dashes", in: "4c4c45440042351080524b4c04f4e4e31xxx"},
		{name: "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := metal.ParseID(tc.in)
			if !tc.ok {
				require.ErrorIs(t, err, metal.ErrMalformedID)

				return
			}

			require.NoError(t, err)
			require.EqualValues(t, tc.want, got)
		})
	}
}

func FuzzParseMachineID(f *testing.F) {
	f.Add(machineA)
	f.Add("")
	f.Add("4c4c4544-0042-3510-8052-b4c04f4e4e3\xff")

	f.Fuzz(func(t *testing.T, s string) {
		id, err := metal.ParseID(s)
		if err == nil {
			again, err := metal.ParseID(id.String())
			require.NoError(t, err)
			require.Equal(t, id, again)
		}
	})
}

// BenchmarkHello compares Hello through the edge proxy with a direct tunnel call (p50/p99).
func BenchmarkHello(b *testing.B) {
	log := zap.NewNop()
	srv := tunnel.New(tunnel.Options{Logger: log, Binding: tunnel.BindOff})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	tln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)

	go srv.Serve(ctx, tln) //nolint:errcheck

	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)

	proxy := grpc.NewServer(srv.ServerOption())
	defer proxy.Stop()

	go proxy.Serve(pln) //nolint:errcheck

	caller, err := grpc.NewClient("passthrough:///"+pln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)

	defer caller.Close() //nolint:errcheck

	conn, err := grpc.NewClient("passthrough:///"+tln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)

	defer conn.Close() //nolint:errcheck

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(rts, &fakeAgent{})

	go rts.Serve(metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, machineA)) //nolint:errcheck
	defer rts.Stop()

	require.Eventually(b, func() bool { return srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	for _, bc := range []struct {
		name string
		conn grpc.ClientConnInterface
	}{
		{name: "direct-tunnel", conn: srv.Channel(machineA)},
		{name: "proxy", conn: caller},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client := agentpb.NewAgentServiceClient(bc.conn)
			cctx := machineCtx(context.Background(), machineA)
			lat := make([]time.Duration, 0, b.N)

			for b.Loop() {
				start := time.Now()
				_, err := client.Hello(cctx, &agentpb.HelloRequest{})
				lat = append(lat, time.Since(start))

				if err != nil {
					b.Fatal(err)
				}
			}

			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}

	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

// A machine the edge switched off or reset answers nothing more and closes nothing: EndBoot ends its tunnel at
// once (a call hanging on it fails, the close is an event, the next boot's agent is taken at once rather than
// refused as a duplicate) and leaves a tunnel opened after the power operation alone.
func TestEndBootEndsTheTunnelOfTheEndedOS(t *testing.T) {
	t.Parallel()

	h := newHarness(t, book{})
	client := agentpb.NewAgentServiceClient(h.caller)

	ended := &fakeAgent{block: make(chan struct{})} // the OS the BMC switches off: no call on it returns
	connect(t, h.tunnelAddr, ended, metal.MetadataKey, machineA)
	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	ctx, cancel := context.WithTimeout(machineCtx(t.Context(), machineA), time.Minute)
	defer cancel()

	hanging := make(chan error, 1)

	go func() {
		_, err := client.WipeDisks(ctx, &agentpb.WipeDisksRequest{})
		hanging <- err
	}()

	require.Eventually(t, func() bool {
		ended.mu.Lock()
		defer ended.mu.Unlock()

		return ended.deadline > 0
	}, 5*time.Second, 10*time.Millisecond, "the call reached the agent")

	powerOff := time.Now()
	h.srv.EndBoot(machineA, powerOff)

	select {
	case err := <-hanging:
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the call on the ended OS's tunnel still hangs")
	}

	require.Eventually(t, func() bool {
		_, closed := h.events.counts()

		return !h.srv.Connected(machineA) && closed == 1
	}, 5*time.Second, 10*time.Millisecond, "the tunnel closed, and the close is an event")

	// the next boot's agent is taken, and the same power operation's EndBoot arriving late leaves it alone
	connect(t, h.tunnelAddr, &fakeAgent{}, metal.MetadataKey, machineA)
	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	h.srv.EndBoot(machineA, powerOff)
	h.srv.EndBoot("4c4c4544-0042-3510-8052-b4c04f4e4e32", time.Now()) // a machine with no tunnel: nothing to end

	_, err := client.Hello(ctx, &agentpb.HelloRequest{})
	require.NoError(t, err)

	opened, closed := h.events.counts()
	require.Equal(t, [2]int{2, 1}, [2]int{opened, closed})
}
