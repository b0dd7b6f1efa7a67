package machineaccess_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// oldEdge answers every call as an edge of a release before the call existed does.
type oldEdge struct{}

func (oldEdge) Invoke(_ context.Context, method string, _, _ any, _ ...grpc.CallOption) error {
	return status.Errorf(codes.Unimplemented, "unknown method %s", method)
}

func (oldEdge) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("not used")
}

// TestInventoryFromAnEarlierEdge: an edge one release behind (v0.2.0 has no Inventory call) is named as such,
// with what to do, not as gRPC's "unknown method"; the code stays Unimplemented.
func TestInventoryFromAnEarlierEdge(t *testing.T) {
	t.Parallel()

	c := machineaccess.New(func(string) (grpc.ClientConnInterface, error) { return oldEdge{}, nil }, locator{here: "s1"})

	_, err := c.BMC("s1", here, &bmcpb.Target{Host: "10.0.0.1"}).Inventory(t.Context())
	require.Equal(t, codes.Unimplemented, status.Code(err))
	require.Contains(t, err.Error(), "the edge of site s1 is of an earlier release, which reads no hardware inventory: upgrade its appliance")
	require.NotContains(t, err.Error(), "unknown method")
}
