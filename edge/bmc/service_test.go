package bmc_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

func serviceClient(t *testing.T) bmcpb.BMCClient {
	t.Helper()

	srv := grpc.NewServer()
	bmc.NewService(manager(t)).Register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	done := make(chan struct{})

	go func() {
		defer close(done)

		_ = srv.Serve(ln) //nolint:errcheck
	}()

	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		srv.Stop()
		<-done
	})

	return bmcpb.NewBMCClient(conn)
}

func TestServiceErrors(t *testing.T) {
	t.Parallel()

	client := serviceClient(t)
	silent := garbageUDP(t, nil)

	for _, tc := range []struct {
		name string
		call func(context.Context) error
		code codes.Code
	}{
		{name: "no target", code: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := client.PowerOn(ctx, &bmcpb.PowerRequest{})

			return err
		}},
		{name: "no boot mode", code: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := client.SetPXEOnce(ctx, &bmcpb.SetPXEOnceRequest{Target: &bmcpb.Target{Host: "127.0.0.1", Username: "u"}})

			return err
		}},
		{name: "silent bmc", code: codes.DeadlineExceeded, call: func(ctx context.Context) error {
			_, err := client.PowerStatus(ctx, &bmcpb.PowerRequest{Target: &bmcpb.Target{
				Host: "127.0.0.1", IpmiPort: uint32(silent), Protocol: bmcpb.Protocol_PROTOCOL_IPMI, //nolint:gosec
				Username: creds.Username, Password: creds.Password,
			}})

			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			err := tc.call(t.Context())
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.NotContains(t, err.Error(), creds.Password)
		})
	}
}
