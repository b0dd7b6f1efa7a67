package machineaccess

import (
	"context"
	"fmt"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/shared/metal"
)

// Agent returns a client for the agent of machineID at siteID. Every call checks that the machine
// is still at that site (Aborted otherwise, before anything is sent: the caller decides again), looks up the
// site's current connection (Unavailable when the site is offline) and carries machine-id metadata.
func (c *Client) Agent(siteID, machineID string) agentpb.AgentServiceClient {
	return agentpb.NewAgentServiceClient(&agentConn{c: c, siteID: siteID, machineID: machineID})
}

// agentConn is a grpc.ClientConnInterface that routes to one machine's agent.
type agentConn struct {
	c                 *Client
	siteID, machineID string
}

func (a *agentConn) route(ctx context.Context) (context.Context, grpc.ClientConnInterface, error) {
	if err := a.c.check(a.siteID, a.machineID); err != nil {
		return nil, nil, status.Error(codes.Aborted, err.Error())
	}

	conn, err := a.c.conn(a.siteID)
	if err != nil {
		return nil, nil, status.Error(codes.Unavailable, fmt.Sprintf("reach agent of machine %s at site %s: %v", a.machineID, a.siteID, err))
	}

	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(metal.MetadataKey, a.machineID) // exactly one value: the edge refuses more

	return metadata.NewOutgoingContext(ctx, md), conn, nil
}

// Invoke implements grpc.ClientConnInterface.
func (a *agentConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx, conn, err := a.route(ctx)
	if err != nil {
		return err
	}

	return conn.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface.
func (a *agentConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, conn, err := a.route(ctx)
	if err != nil {
		return nil, err
	}

	return conn.NewStream(ctx, desc, method, opts...)
}
