package tunnel_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/intents"
	"github.com/outpost-metal/outpost/edge/tunnel"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
	"github.com/outpost-metal/outpost/shared/metal"
)

// newIntentHarness is newHarness with an intent store behind the proxy.
func newIntentHarness(t *testing.T) *harness {
	t.Helper()

	cfg := intents.Default()
	cfg.Dir = t.TempDir()

	store, err := intents.Open(cfg, zaptest.NewLogger(t), time.Now)
	require.NoError(t, err)

	srv := tunnel.New(tunnel.Options{Logger: zaptest.NewLogger(t), Binding: tunnel.BindOff, Intents: store,
		Addresses: book{machineA: netip.MustParseAddr("127.0.0.1")}})

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
		require.NoError(t, store.Close())
	})

	return &harness{srv: srv, tunnelAddr: tln.Addr().String(), caller: caller}
}

// A wipe whose caller goes away mid-call (an uplink cut) goes on at the agent; the controller's repeat of the
// same intent is answered from the edge's record, with no second wipe, even once the agent is gone.
func TestProxiedIntentIsCarriedOutOnce(t *testing.T) {
	t.Parallel()

	h := newIntentHarness(t)
	agent := &fakeAgent{block: make(chan struct{})}
	stop, _ := connect(t, h.tunnelAddr, agent, metal.MetadataKey, machineA)

	require.Eventually(t, func() bool { return h.srv.Connected(machineA) }, 5*time.Second, 10*time.Millisecond)

	client := agentpb.NewAgentServiceClient(h.caller)
	wipeCtx := func(ctx context.Context, intent string) context.Context {
		return intentspb.NewOutgoingContext(machineCtx(ctx, machineA), intent)
	}

	cut, cancel := context.WithCancel(wipeCtx(t.Context(), "wipe-1"))
	first := make(chan error, 1)

	go func() {
		_, err := client.WipeDisks(cut, &agentpb.WipeDisksRequest{})
		first <- err
	}()

	// the agent has the call (it notes the deadline the edge gave it: the store's, the caller set none)
	require.Eventually(t, func() bool {
		agent.mu.Lock()
		defer agent.mu.Unlock()

		return agent.deadline > 0
	}, 5*time.Second, 5*time.Millisecond)

	cancel()
	require.Equal(t, codes.Canceled, status.Code(<-first), "the caller went away")

	// the repeat joins the running wipe; the agent finishes it
	repeated := make(chan error, 1)

	go func() {
		_, err := client.WipeDisks(wipeCtx(t.Context(), "wipe-1"), &agentpb.WipeDisksRequest{})
		repeated <- err
	}()

	close(agent.block)
	require.NoError(t, <-repeated)

	stop()

	_, err := client.WipeDisks(wipeCtx(t.Context(), "wipe-1"), &agentpb.WipeDisksRequest{})
	require.NoError(t, err, "a repeat of a done intent is answered without the agent")

	agent.mu.Lock()
	require.Equal(t, 1, agent.wiped)
	agent.mu.Unlock()

	// A new intent needs the agent; without a tunnel it fails and is recorded as failed.
	_, err = client.WipeDisks(wipeCtx(t.Context(), "wipe-2"), &agentpb.WipeDisksRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))

	// An intent ID that is not one is refused before anything is done.
	bad := metadata.AppendToOutgoingContext(machineCtx(t.Context(), machineA), intentspb.MetadataKey, "no/such id")
	_, err = client.WipeDisks(bad, &agentpb.WipeDisksRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}
