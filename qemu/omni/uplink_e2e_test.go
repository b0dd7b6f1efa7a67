package omni_test

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/bootevents"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	"github.com/outpost-metal/outpost/qemu/omni"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// uplinkEdge is a fake site edge behind the real uplink: one machine with a BMC, an agent and the site's boot
// table, modelled as state. It serves the BMC, agent and boot-plan services the real edge serves and reports boot
// answers and agent tunnels as the real edge's events.
type uplinkEdge struct {
	bmcpb.UnimplementedBMCServer
	agentpb.UnimplementedAgentServiceServer
	bootpb.UnimplementedBootPlansServer

	mu        sync.Mutex
	machineID string
	power     bool
	pxeOnce   bool
	agent     bool
	booted    string
	table     *bootpb.Table
	wipes     int
	powerOns  []string // the table's mode for the machine at each power-on
	journal   []*bootpb.Event
	published chan struct{}
}

func newUplinkEdge(machineID string) *uplinkEdge {
	e := &uplinkEdge{machineID: machineID, published: make(chan struct{}, 1)}
	e.bootLocked() // the machine is running its agent when the test starts

	return e
}

func (e *uplinkEdge) register(s grpc.ServiceRegistrar) {
	bmcpb.RegisterBMCServer(s, e)
	agentpb.RegisterAgentServiceServer(s, e)
	bootpb.RegisterBootPlansServer(s, e)
}

func (e *uplinkEdge) eventLocked(ev *bootpb.Event) {
	ev.Sequence = uint64(len(e.journal) + 1)
	e.journal = append(e.journal, ev)

	select {
	case e.published <- struct{}{}:
	default:
	}
}

func (e *uplinkEdge) planModeLocked() bootpb.Mode {
	for _, p := range e.table.GetPlans() {
		if p.GetUuid() == e.machineID {
			return p.GetMode()
		}
	}

	return bootpb.Mode_MODE_AGENT
}

// bootLocked starts the machine: one-time PXE or no installed OS boots the table's plan.
func (e *uplinkEdge) bootLocked() {
	mode := e.planModeLocked()
	if !e.pxeOnce && e.booted == "install" {
		mode = bootpb.Mode_MODE_DISK
	}

	e.power, e.pxeOnce = true, false
	e.booted = map[bootpb.Mode]string{bootpb.Mode_MODE_AGENT: "agent", bootpb.Mode_MODE_INSTALL: "install", bootpb.Mode_MODE_DISK: "disk"}[mode]
	e.agent = mode == bootpb.Mode_MODE_AGENT

	e.eventLocked(&bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: e.machineID, Arch: "x86_64", Mode: e.booted}}})
	e.eventLocked(&bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: e.machineID, Open: e.agent}}})
}

// publish delivers the journal to the controller for the life of a session, as the edge's journal does.
func (e *uplinkEdge) publish(ctx context.Context, conn grpc.ClientConnInterface) error {
	client := bootpb.NewEventsClient(conn)

	var acked uint64

	for {
		e.mu.Lock()
		pending := make([]*bootpb.Event, 0, len(e.journal))

		for _, ev := range e.journal {
			if ev.GetSequence() > acked {
				pending = append(pending, proto.Clone(ev).(*bootpb.Event))
			}
		}
		e.mu.Unlock()

		if len(pending) > 0 {
			resp, err := client.Publish(ctx, &bootpb.PublishRequest{JournalId: "journal-1", Events: pending})
			if err != nil {
				return nil // the session ended; the next one resends
			}

			acked = resp.GetAcked()

			continue
		}

		select {
		case <-ctx.Done():
			return nil
		case <-e.published:
		}
	}
}

func (e *uplinkEdge) State(context.Context, *bootpb.StateRequest) (*bootpb.StateResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return &bootpb.StateResponse{Version: e.table.GetVersion()}, nil
}

func (e *uplinkEdge) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	if req.GetSnapshot() == nil {
		return nil, status.Error(codes.FailedPrecondition, "send a snapshot")
	}

	e.mu.Lock()
	defer e.mu.Unlock()

	e.table = proto.Clone(req.GetSnapshot()).(*bootpb.Table)

	return &bootpb.ApplyResponse{Version: e.table.GetVersion()}, nil
}

func (e *uplinkEdge) PowerStatus(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerStatusResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return &bmcpb.PowerStatusResponse{On: e.power}, nil
}

func (e *uplinkEdge) PowerOn(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.powerOns = append(e.powerOns, e.planModeLocked().String())
	e.bootLocked()

	return &bmcpb.PowerResponse{}, nil
}

func (e *uplinkEdge) PowerCycle(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.bootLocked()

	return &bmcpb.PowerResponse{}, nil
}

func (e *uplinkEdge) PowerOff(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.power, e.agent = false, false
	e.eventLocked(&bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: e.machineID}}})

	return &bmcpb.PowerResponse{}, nil
}

func (e *uplinkEdge) SetPXEOnce(context.Context, *bmcpb.SetPXEOnceRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.pxeOnce = true

	return &bmcpb.PowerResponse{}, nil
}

// agentCall checks the call reaches a connected agent of the machine named in the metadata.
func (e *uplinkEdge) agentCall(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if ids := md.Get(metal.MetadataKey); len(ids) != 1 || ids[0] != e.machineID || !e.agent {
		return status.Error(codes.Unavailable, "no agent tunnel for this machine")
	}

	return nil
}

func (e *uplinkEdge) Hello(ctx context.Context, _ *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return &agentpb.HelloResponse{}, e.agentCall(ctx)
}

func (e *uplinkEdge) GetPowerManagement(ctx context.Context, _ *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	if err := e.agentCall(ctx); err != nil {
		return nil, err
	}

	return &agentpb.GetPowerManagementResponse{Ipmi: &agentpb.GetPowerManagementResponse_IPMI{Address: "10.5.0.20", Port: 623}}, nil
}

func (e *uplinkEdge) SetPowerManagement(ctx context.Context, _ *agentpb.SetPowerManagementRequest) (*agentpb.SetPowerManagementResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return &agentpb.SetPowerManagementResponse{}, e.agentCall(ctx)
}

func (e *uplinkEdge) WipeDisks(ctx context.Context, _ *agentpb.WipeDisksRequest) (*agentpb.WipeDisksResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	if err := e.agentCall(ctx); err != nil {
		return nil, err
	}

	e.wipes++

	return &agentpb.WipeDisksResponse{}, nil
}

func (e *uplinkEdge) snapshot() (power bool, booted string, wipes int, powerOns []string) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.power, e.booted, e.wipes, append([]string(nil), e.powerOns...)
}

// TestLifecycleOverTheUplink runs the whole controller side (Omni connection, lifecycle, boot tables, event
// receiver, machine access) against the Omni stand-in and a fake edge behind the real uplink: the machine
// joins, is accepted, provisioned, wiped, powered off; the site's WAN link fails and the machine is allocated;
// once the site is back it is powered on into the installer exactly once, with the edge holding the install plan.
func TestLifecycleOverTheUplink(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	logger := zaptest.NewLogger(t)
	s := startStandIn(t, omni.Default())
	admin := omni.NewAdmin(s.client(t, s.AdminKey()))

	// controller side of the uplink
	tables := boottables.New(logger, nil)
	locations := machines.NewLocations(logger)
	receiver := bootevents.NewReceiver(logger, sites.SiteFromContext, locations)

	ctrl := linklab.StartController(t, linklab.ControllerOptions{
		Register: []func(grpc.ServiceRegistrar){receiver.Register},
		OnSession: []sites.SessionFunc{tables.OnSession, func(ctx context.Context, site string, _ grpc.ClientConnInterface) error {
			<-ctx.Done()
			locations.SiteOffline(site)

			return nil
		}},
	})

	// the site's edge
	edge := newUplinkEdge(id)
	wan := linklab.StartProxy(t, ctrl.Addr)
	linklab.StartEdge(t, wan.Addr, ctrl.CreateSite(t, "site-a", sites.TokenOptions{}), linklab.EdgeOptions{
		Options: edgeuplink.Options{Register: []func(grpc.ServiceRegistrar){edge.register}, OnSession: []edgeuplink.SessionFunc{edge.publish}},
	})
	ctrl.WaitConnected(t, "site-a")

	// the lifecycle on Omni
	conn, err := controlleromni.Connect(ctx, connectConfig(s, s.ProviderKey()), logger)
	require.NoError(t, err)

	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	planner, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), lifecycletest.FakeResolver{})
	require.NoError(t, err)

	edges := &machines.EdgeClients{Access: machineaccess.New(ctrl.Server.Conn, locations.ByResourceID()), Sites: locations}

	cfg := lifecycle.Default()
	cfg.Cooldown = 300 * time.Millisecond
	cfg.PollInterval = 50 * time.Millisecond
	cfg.CallTimeout = 5 * time.Second

	ctrls, err := lifecycle.New(cfg, lifecycle.Deps{
		Types: conn.Types(), Power: edges, Agent: edges, Intents: edges, Sites: locations.ByResourceID(), Plans: tables,
		Planner: planner, Now: time.Now, Rand: rand.Reader,
	})
	require.NoError(t, err)

	rt, err := conn.NewRuntime(nil, ctrls...)
	require.NoError(t, err)

	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	go func() { done <- rt.Run(rctx) }()

	t.Cleanup(func() { rcancel(); <-done })

	// the machine's agent joins Omni; the edge has reported it
	_, err = s.provision(t, ctx, id)
	require.NoError(t, err)

	_, err = s.State().WatchFor(ctx, infra.NewMachine(id).Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)
	require.NoError(t, admin.Accept(ctx, id))

	require.Eventually(t, func() bool {
		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, s.State(), id)

		return err == nil && st.TypedSpec().Value.ReadyToUse
	}, 30*time.Second, 20*time.Millisecond, "ready over the uplink")

	// Omni keeps the machine on until it has collected its information, which only a real Talos reporting in
	// over SideroLink gives it; the stand-in is told here.
	require.NoError(t, admin.CollectInfo(ctx, id, "v1.11.0"))
	require.Eventually(t, func() bool { power, _, _, _ := edge.snapshot(); return !power }, 30*time.Second, 20*time.Millisecond, "powered off")

	_, _, wipes, _ := edge.snapshot()
	require.Equal(t, 1, wipes)

	// the site's WAN link fails, then the machine is allocated: nothing happens until the site is back
	wan.SetDown(true)
	wan.Cut()
	require.Eventually(t, func() bool { _, err := ctrl.Server.Conn("site-a"); return err != nil }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, admin.Allocate(ctx, id, "c1", "v1.11.0", nil, false))
	require.Never(t, func() bool { _, _, _, ons := edge.snapshot(); return len(ons) > 0 }, 500*time.Millisecond, 20*time.Millisecond,
		"no power-on while the site is offline")

	wan.SetDown(false)
	require.Eventually(t, func() bool { _, booted, _, _ := edge.snapshot(); return booted == "install" }, 30*time.Second, 20*time.Millisecond)

	require.Never(t, func() bool { _, _, _, ons := edge.snapshot(); return len(ons) != 1 }, 500*time.Millisecond, 20*time.Millisecond,
		"powered on exactly once")

	_, _, _, powerOns := edge.snapshot()
	require.Equal(t, []string{bootpb.Mode_MODE_INSTALL.String()}, powerOns, "the edge held the install plan at power-on")
}
