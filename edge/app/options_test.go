package app_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/edge/app"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// fakeBMCs answers every power status "on" and reports the host it was asked about.
type fakeBMCs struct {
	bmcpb.UnimplementedBMCServer

	asked chan string
}

func (f fakeBMCs) PowerStatus(_ context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerStatusResponse, error) {
	f.asked <- req.GetTarget().GetHost()

	return &bmcpb.PowerStatusResponse{On: true}, nil
}

// runEdge runs a built edge until stop is called.
func runEdge(t *testing.T, edge *app.Edge) (stop func()) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- edge.Run(ctx) }()

	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}

// Options.BMCs answers the controller's BMC calls in place of edge/bmc (the fleet simulator's BMCs).
func TestOptionsBMCsAnswerTheController(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	api, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	bmcs := fakeBMCs{asked: make(chan string, 1)}

	edge, err := app.Build(t.Context(), edgeConfig(t), zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)),
		app.Options{ControllerAPI: api, BMCs: bmcs})
	require.NoError(t, err)

	defer runEdge(t, edge)()

	conn, err := grpc.NewClient("passthrough:///"+api.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	resp, err := bmcpb.NewBMCClient(conn).PowerStatus(ctx, &bmcpb.PowerRequest{Target: &bmcpb.Target{Host: "127.0.0.1"}})
	require.NoError(t, err)
	require.True(t, resp.GetOn())
	require.Equal(t, "127.0.0.1", <-bmcs.asked)
}

// Options.Dial opens the uplink's connections (the fleet simulator's WAN links).
func TestOptionsDialOpensTheUplink(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	cfg := edgeConfig(t)
	dialled := make(chan string, 16)

	edge, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), app.Options{
		Dial: func(_ context.Context, address string) (net.Conn, error) {
			select {
			case dialled <- address:
			default:
			}

			return nil, errors.New("link down")
		},
	})
	require.NoError(t, err)

	defer runEdge(t, edge)()

	select {
	case addr := <-dialled:
		require.Equal(t, cfg.Uplink.ControllerAddress, addr)
	case <-time.After(30 * time.Second):
		t.Fatal("the uplink did not dial through Options.Dial")
	}
}
