package tunnel_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/metal"
)

// evidence is a boot-evidence book the test edits: where each machine's boot fetched from, and which are
// contested.
type evidence struct {
	mu        sync.Mutex
	addr      map[metal.ID]netip.Addr
	contested map[metal.ID]bool
}

func (e *evidence) BootAddr(id metal.ID) (netip.Addr, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()

	a, ok := e.addr[id]

	return a, ok
}

func (e *evidence) Contested(id metal.ID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.contested[id]
}

func (e *evidence) set(id metal.ID, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.addr[id] = netip.MustParseAddr(addr)
}

// connectFrom opens a reverse tunnel for machineID from source address src; errs gets the tunnel's end.
func connectFrom(t *testing.T, addr, src, machineID string, agent agentpb.AgentServiceServer) (stop func(), errs <-chan error) {
	t.Helper()

	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}

	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", a) }))
	require.NoError(t, err)

	rts := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(rts, agent)

	ctx, cancel := context.WithCancel(context.Background())
	ctx = metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, machineID)

	errCh := make(chan error, 1)
	finished := make(chan struct{})

	go func() {
		defer close(finished)

		_, err := rts.Serve(ctx)
		errCh <- err
	}()

	var once sync.Once

	stop = func() {
		once.Do(func() {
			cancel()
			<-finished
			rts.Stop()
			conn.Close() //nolint:errcheck
		})
	}

	t.Cleanup(stop)

	return stop, errCh
}

// A host on the site network cannot take over a machine's agent calls by claiming its UUID: a tunnel is bound
// to the address the machine's boot fetched from, one live tunnel per machine, and a boot fetch forged after
// the machine's tunnel is up changes nothing while it lives. Two machines claiming one UUID get nothing.
func TestTunnelBindingRefusesRogues(t *testing.T) {
	t.Parallel()

	const victim, clone = "4c4c4544-0042-3510-8052-b4c04f4e4e41", "4c4c4544-0042-3510-8052-b4c04f4e4e42"

	ev := &evidence{addr: map[metal.ID]netip.Addr{}, contested: map[metal.ID]bool{clone: true}}
	ev.set(victim, "127.0.0.10")
	ev.set(clone, "127.0.0.30")

	refused := &refusals{}
	srv := tunnel.New(tunnel.Options{Logger: zaptest.NewLogger(t), Evidence: ev, Events: refused})

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

	addr := tln.Addr().String()
	agentOf := agentpb.NewAgentServiceClient(caller)

	// a rogue with the victim's UUID, before the victim booted its agent: refused (not the boot address)
	rogue := &fakeAgent{}
	_, rogueErrs := connectFrom(t, addr, "127.0.0.20", victim, rogue)
	require.ErrorContains(t, waitErr(t, rogueErrs), "the machine booted from 127.0.0.10")

	// the victim, from its boot address: bound
	real := &fakeAgent{}
	stopReal, _ := connectFrom(t, addr, "127.0.0.10", victim, real)
	require.Eventually(t, func() bool { return srv.Connected(victim) }, 5*time.Second, 10*time.Millisecond)

	// the rogue forges a boot fetch (the evidence now names it) and tries again: the victim's tunnel lives
	ev.set(victim, "127.0.0.20")
	_, rogueErrs = connectFrom(t, addr, "127.0.0.20", victim, rogue)
	require.ErrorContains(t, waitErr(t, rogueErrs), "already has one")

	for range 10 {
		_, err := agentOf.WipeDisks(machineCtx(t.Context(), victim), &agentpb.WipeDisksRequest{})
		require.NoError(t, err)
	}

	require.Equal(t, 10, real.wipeCount(), "every wipe reached the victim")
	require.Zero(t, rogue.wipeCount(), "none reached the rogue")

	// two machines claim one UUID: neither is bound until the duplicate is fixed
	_, cloneErrs := connectFrom(t, addr, "127.0.0.30", clone, &fakeAgent{})
	require.ErrorContains(t, waitErr(t, cloneErrs), "two machines asked for its boot script")

	// each refusal of a machine that booted here reached the controller's sink once, with the rogue's address;
	// a second attempt of the same kind within a minute adds nothing, and a made-up UUID none at all
	_, rogueErrs = connectFrom(t, addr, "127.0.0.20", victim, rogue)
	require.ErrorContains(t, waitErr(t, rogueErrs), "already has one")
	_, strangerErrs := connectFrom(t, addr, "127.0.0.40", "4c4c4544-0042-3510-8052-b4c04f4e4e49", &fakeAgent{})
	require.ErrorContains(t, waitErr(t, strangerErrs), "did not boot through this edge")

	require.Equal(t, []string{
		victim + " source_not_boot_address 127.0.0.20",
		victim + " duplicate_machine_id 127.0.0.20",
		clone + " contested_machine_id 127.0.0.30",
	}, refused.list())

	// the victim's tunnel goes; a new one is taken from the (new) evidence only
	stopReal()
	require.Eventually(t, func() bool { return !srv.Connected(victim) }, 5*time.Second, 10*time.Millisecond)
	ev.set(victim, "127.0.0.10")
	connectFrom(t, addr, "127.0.0.10", victim, real)
	require.Eventually(t, func() bool { return srv.Connected(victim) }, 5*time.Second, 10*time.Millisecond, "the rebooted victim binds again")
}

func waitErr(t *testing.T, errs <-chan error) error {
	t.Helper()

	select {
	case err := <-errs:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the tunnel was not refused")

		return nil
	}
}

func (f *fakeAgent) wipeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.wiped
}

// refusals is a tunnel event sink that records the refusals it is told of.
type refusals struct {
	mu   sync.Mutex
	seen []string
}

func (r *refusals) TunnelOpened(tunnel.Event) {}

func (r *refusals) TunnelClosed(tunnel.Event) {}

func (r *refusals) TunnelRefused(f tunnel.Refusal) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.seen = append(r.seen, f.MachineID+" "+f.Reason.Name()+" "+f.RemoteAddr.Addr().String())
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()

	return slices.Clone(r.seen)
}
