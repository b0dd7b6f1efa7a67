package machines_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/gen/optional"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// watchingEdge records the watch lists it is sent and knows one machine's power.
type watchingEdge struct {
	bmcpb.UnimplementedBMCServer

	mu        sync.Mutex
	lists     [][]string
	protocols []bmcpb.Protocol // of the last list's targets
}

func (e *watchingEdge) Watch(_ context.Context, req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	var ids []string

	e.protocols = nil
	for _, t := range req.GetTargets() {
		ids = append(ids, t.GetMachineId()+"@"+t.GetHost())
		e.protocols = append(e.protocols, t.GetProtocol())
	}

	e.lists = append(e.lists, ids)

	return &bmcpb.WatchResponse{Watching: uint32(len(ids)), Known: []*bmcpb.WatchedPower{{MachineId: id1, State: "on"}}}, nil
}

func (e *watchingEdge) sent() int {
	e.mu.Lock()
	defer e.mu.Unlock()

	return len(e.lists)
}

func (e *watchingEdge) last() []string {
	e.mu.Lock()
	defer e.mu.Unlock()

	if len(e.lists) == 0 {
		return nil
	}

	return e.lists[len(e.lists)-1]
}

const (
	id1 = "4c4c4544-0042-3510-8052-b4c04f384851"
	id2 = "4c4c4544-0042-3510-8052-b4c04f384852"
)

// A site's edge is sent the BMCs of its machines at the start of a session and again when the list changes;
// the power states it knows reach the locations.
func TestWatchListsFollowTheSite(t *testing.T) {
	t.Parallel()

	edge := &watchingEdge{}
	conn := serveEdge(t, func(srv *grpc.Server) { bmcpb.RegisterBMCServer(srv, edge) })

	locs := machines.NewLocations(zaptest.NewLogger(t))
	_, err := locs.Seen("site-a", id1)
	require.NoError(t, err)

	lists := machines.NewWatchLists(zaptest.NewLogger(t), bmcpb.Protocol_PROTOCOL_IPMI, nil, locs)

	bmc := func(host string) *specs.BMCConfigurationSpec {
		return &specs.BMCConfigurationSpec{Ipmi: &specs.BMCConfigurationSpec_IPMI{Address: host, Port: 623, Username: "u", Password: "p"}}
	}

	lists.Set("site-a", id1, bmc("10.0.0.1"))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- lists.OnSession(ctx, "site-a", conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.Eventually(t, func() bool { return len(edge.last()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{id1 + "@10.0.0.1"}, edge.last())
	require.Eventually(t, func() bool { loc, _ := locs.Locate(id1); return loc.Power == "on" }, 5*time.Second, 5*time.Millisecond,
		"the state the edge knows reaches the locations")
	require.True(t, lists.Watching("site-a", id1))

	lists.Set("site-a", id2, bmc("10.0.0.2"))
	require.Eventually(t, func() bool { return len(edge.last()) == 2 }, 5*time.Second, 5*time.Millisecond, "a change is sent")

	lists.Set("site-b", id1, bmc("10.0.0.1")) // the machine moved
	require.Eventually(t, func() bool { return len(edge.last()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{id2 + "@10.0.0.2"}, edge.last())
	require.False(t, lists.Watching("site-a", id1))

	lists.Remove(id2)
	require.Eventually(t, func() bool { return len(edge.last()) == 0 && edge.sent() > 3 }, 5*time.Second, 5*time.Millisecond)
}

func (e *watchingEdge) lastProtocols() []bmcpb.Protocol {
	e.mu.Lock()
	defer e.mu.Unlock()

	return slices.Clone(e.protocols)
}

// A site's own BMC protocol reaches its edge's watch list, and a change of it is sent at once; another site
// keeps the controller's.
func TestWatchListsFollowTheSitesProtocol(t *testing.T) {
	t.Parallel()

	edge := &watchingEdge{}
	conn := serveEdge(t, func(srv *grpc.Server) { bmcpb.RegisterBMCServer(srv, edge) })

	policies := machines.NewSitePolicies()
	require.NoError(t, policies.Set("site-a", machines.SitePolicy{BMCProtocol: optional.Some(bmcpb.Protocol_PROTOCOL_REDFISH)}))

	lists := machines.NewWatchLists(zaptest.NewLogger(t), bmcpb.Protocol_PROTOCOL_IPMI, policies, nil)

	bmc := &specs.BMCConfigurationSpec{Ipmi: &specs.BMCConfigurationSpec_IPMI{Address: "10.0.0.1", Port: 623, Username: "u", Password: "p"}}
	lists.Set("site-a", id1, bmc)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- lists.OnSession(ctx, "site-a", conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.Eventually(t, func() bool {
		return slices.Equal(edge.lastProtocols(), []bmcpb.Protocol{bmcpb.Protocol_PROTOCOL_REDFISH})
	},
		5*time.Second, 5*time.Millisecond, "the site's own protocol: %v", edge.lastProtocols())

	require.NoError(t, policies.Set("site-a", machines.SitePolicy{BMCProtocol: optional.Some(bmcpb.Protocol_PROTOCOL_AUTO)}))
	require.Eventually(t, func() bool { return slices.Equal(edge.lastProtocols(), []bmcpb.Protocol{bmcpb.Protocol_PROTOCOL_AUTO}) },
		5*time.Second, 5*time.Millisecond, "the change is sent: %v", edge.lastProtocols())

	require.NoError(t, policies.Set("site-b", machines.SitePolicy{WipeMethod: "zeroes"}))
	require.Equal(t, machines.WipeZeroes, policies.WipeMethod("site-b", machines.WipeFast))
	require.Equal(t, machines.WipeFast, policies.WipeMethod("site-a", machines.WipeFast))
	require.Equal(t, bmcpb.Protocol_PROTOCOL_IPMI, policies.BMCProtocol("site-b", bmcpb.Protocol_PROTOCOL_IPMI))
}
