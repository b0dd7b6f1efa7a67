package machines_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/siderolabs/gen/optional"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// siteEdge is one site's edge as gRPC sees it: the BMC service and the agent proxy, recording what arrives.
type siteEdge struct {
	bmcpb.UnimplementedBMCServer
	agentpb.UnimplementedAgentServiceServer

	mu      sync.Mutex
	on      bool
	pxeMode bmcpb.BootMode
	target  *bmcpb.Target
	hellos  []string // machine-id metadata of agent calls
	// bmcSilent makes the BMC calls fail as the edge's BMC service does when the BMC does not answer.
	bmcSilent bool
	// override is what GetBootOverride answers (nil: Unimplemented, as a BMC that cannot say).
	override *bmcpb.GetBootOverrideResponse
}

func (e *siteEdge) GetBootOverride(context.Context, *bmcpb.PowerRequest) (*bmcpb.GetBootOverrideResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	if e.override == nil {
		return nil, status.Error(codes.Unimplemented, "no boot override read-back")
	}

	return e.override, nil
}

func (e *siteEdge) PowerStatus(_ context.Context, r *bmcpb.PowerRequest) (*bmcpb.PowerStatusResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.target = r.GetTarget()

	if e.bmcSilent {
		return nil, status.Error(codes.Unavailable, "power status on bmc "+r.GetTarget().GetHost()+": no answer from the bmc")
	}

	return &bmcpb.PowerStatusResponse{On: e.on}, nil
}

func (e *siteEdge) PowerOn(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.on = true

	return &bmcpb.PowerResponse{}, nil
}

func (e *siteEdge) SetPXEOnce(_ context.Context, r *bmcpb.SetPXEOnceRequest) (*bmcpb.PowerResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.pxeMode = r.GetMode()

	return &bmcpb.PowerResponse{}, nil
}

func (e *siteEdge) Hello(ctx context.Context, _ *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)

	e.mu.Lock()
	defer e.mu.Unlock()

	e.hellos = append(e.hellos, md.Get(metal.MetadataKey)...)

	return &agentpb.HelloResponse{}, nil
}

var errOffline = errors.New("site offline")

func TestEdgeClientsOverGRPC(t *testing.T) {
	t.Parallel()

	edge := &siteEdge{}
	conn := serveEdge(t, func(srv *grpc.Server) {
		bmcpb.RegisterBMCServer(srv, edge)
		agentpb.RegisterAgentServiceServer(srv, edge)
	})

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	locs := machines.NewLocations(zaptest.NewLogger(t))
	_, err := locs.Seen("site-a", id)
	require.NoError(t, err)
	locs.SetFirmware(id, "uefi", "ipxe")

	access := machineaccess.New(func(site string) (grpc.ClientConnInterface, error) {
		if site != "site-a" {
			return nil, errOffline
		}

		return conn, nil
	}, locs.ByResourceID())

	c := &machines.EdgeClients{Access: access, Sites: locs}
	ctx := t.Context()
	bmc := &specs.BMCConfigurationSpec{Ipmi: &specs.BMCConfigurationSpec_IPMI{Address: "10.0.0.5", Port: 623, Username: "outpost", Password: "pw"}}

	ps, err := c.PowerStatus(ctx, "site-a", id, bmc)
	require.NoError(t, err)
	require.Equal(t, machines.PowerOff, ps)
	require.Equal(t, "10.0.0.5", edge.target.GetHost())
	require.Equal(t, "outpost", edge.target.GetUsername())
	require.Equal(t, bmcpb.Protocol_PROTOCOL_AUTO, edge.target.GetProtocol(), "by default the edge probes Redfish, then IPMI")

	for _, tc := range []struct {
		setting string
		want    bmcpb.Protocol
	}{{"ipmi", bmcpb.Protocol_PROTOCOL_IPMI}, {"redfish", bmcpb.Protocol_PROTOCOL_REDFISH}, {"auto", bmcpb.Protocol_PROTOCOL_AUTO}, {"", bmcpb.Protocol_PROTOCOL_AUTO}} {
		proto, err := machines.ParseBMCProtocol(tc.setting)
		require.NoError(t, err)

		pc := &machines.EdgeClients{Access: access, Sites: locs, BMCProtocol: proto}
		_, err = pc.PowerStatus(ctx, "site-a", id, bmc)
		require.NoError(t, err)
		require.Equal(t, tc.want, edge.target.GetProtocol(), tc.setting)
	}

	_, err = machines.ParseBMCProtocol("smoke-signals")
	require.ErrorContains(t, err, "want auto, ipmi or redfish")

	// A site's own protocol comes before the controller's, and handing it back restores the controller's.
	policies := machines.NewSitePolicies()
	require.NoError(t, policies.Set("site-a", machines.SitePolicy{BMCProtocol: optional.Some(bmcpb.Protocol_PROTOCOL_REDFISH)}))
	require.ErrorContains(t, policies.Set("site-a", machines.SitePolicy{WipeMethod: "shred"}), `wipe method "shred"`)

	pc := &machines.EdgeClients{Access: access, Sites: locs, BMCProtocol: bmcpb.Protocol_PROTOCOL_IPMI, Policies: policies}
	_, err = pc.PowerStatus(ctx, "site-a", id, bmc)
	require.NoError(t, err)
	require.Equal(t, bmcpb.Protocol_PROTOCOL_REDFISH, edge.target.GetProtocol(), "the site's own")

	require.NoError(t, policies.Set("site-a", machines.SitePolicy{}))
	_, err = pc.PowerStatus(ctx, "site-a", id, bmc)
	require.NoError(t, err)
	require.Equal(t, bmcpb.Protocol_PROTOCOL_IPMI, edge.target.GetProtocol(), "the controller's again")

	require.NoError(t, c.SetPXEOnce(ctx, "site-a", id, bmc))
	require.Equal(t, bmcpb.BootMode_BOOT_MODE_UEFI, edge.pxeMode)
	require.NoError(t, c.Power(ctx, "site-a", id, bmc, machineaccess.PowerOn))

	ps, err = c.PowerStatus(ctx, "site-a", id, bmc)
	require.NoError(t, err)
	require.Equal(t, machines.PowerOn, ps)

	require.NoError(t, c.Hello(ctx, "site-a", id))
	require.Equal(t, []string{id}, edge.hellos)

	// A BMC that does not answer: the edge says Unavailable, but the site is online, so it is not
	// reported as an offline site.
	edge.mu.Lock()
	edge.bmcSilent = true
	edge.mu.Unlock()

	_, err = c.PowerStatus(ctx, "site-a", id, bmc)
	require.Error(t, err)
	require.NotErrorIs(t, err, machines.ErrSiteOffline)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.ErrorContains(t, err, "no answer from the bmc")

	edge.mu.Lock()
	edge.bmcSilent = false
	edge.mu.Unlock()

	// the machine moves to site-b, which is offline: calls are refused or reported offline, never sent to site-a
	_, err = locs.Seen("site-b", id)
	require.NoError(t, err)
	require.ErrorIs(t, c.Power(ctx, "site-b", id, bmc, machineaccess.PowerOn), machines.ErrSiteOffline)
	require.Error(t, c.Power(ctx, "site-a", id, bmc, machineaccess.PowerCycle), "machine is no longer at site-a")
	require.ErrorIs(t, c.Hello(ctx, "site-b", id), machines.ErrSiteOffline)

	_, err = c.PowerStatus(ctx, "site-a", id, &specs.BMCConfigurationSpec{ApiAddress: "agent"})
	require.ErrorIs(t, err, machines.ErrNoIPMI)
}

// A machine that never booted through the edge (the site's DHCP hands out the boot file): its one-time PXE
// boot takes the mode the BMC holds, else the configured default; never "boot mode is required".
func TestSetPXEOnceWithoutKnownFirmware(t *testing.T) {
	t.Parallel()

	edge := &siteEdge{}
	conn := serveEdge(t, func(srv *grpc.Server) { bmcpb.RegisterBMCServer(srv, edge) })

	const id = "4c4c4544-0042-3510-8052-b4c04f384835"

	locs := machines.NewLocations(zaptest.NewLogger(t))
	require.NoError(t, locs.AgentConnected("site-a", id, true)) // joined without a boot through the edge

	access := machineaccess.New(func(string) (grpc.ClientConnInterface, error) { return conn, nil }, locs.ByResourceID())
	bmc := &specs.BMCConfigurationSpec{Ipmi: &specs.BMCConfigurationSpec_IPMI{Address: "10.0.0.5", Port: 623, Username: "u", Password: "p"}}

	for _, tc := range []struct {
		name     string
		def      metal.Firmware
		override *bmcpb.GetBootOverrideResponse
		want     bmcpb.BootMode
	}{
		{name: "bmc cannot say: default uefi", want: bmcpb.BootMode_BOOT_MODE_UEFI},
		{name: "bmc cannot say: default bios", def: "bios", want: bmcpb.BootMode_BOOT_MODE_BIOS},
		{name: "bmc holds the efi flag", def: "bios", override: &bmcpb.GetBootOverrideResponse{Mode: bmcpb.BootMode_BOOT_MODE_UEFI},
			want: bmcpb.BootMode_BOOT_MODE_UEFI},
		{name: "legacy override in effect", override: &bmcpb.GetBootOverrideResponse{Set: true, Mode: bmcpb.BootMode_BOOT_MODE_BIOS},
			want: bmcpb.BootMode_BOOT_MODE_BIOS},
		{name: "no override, no efi flag: the default", override: &bmcpb.GetBootOverrideResponse{Mode: bmcpb.BootMode_BOOT_MODE_BIOS},
			want: bmcpb.BootMode_BOOT_MODE_UEFI},
	} {
		edge.mu.Lock()
		edge.override, edge.pxeMode = tc.override, bmcpb.BootMode_BOOT_MODE_UNSPECIFIED
		edge.mu.Unlock()

		c := &machines.EdgeClients{Access: access, Sites: locs, DefaultBootMode: tc.def}
		require.NoError(t, c.SetPXEOnce(t.Context(), "site-a", id, bmc), tc.name)

		edge.mu.Lock()
		require.Equal(t, tc.want, edge.pxeMode, tc.name)
		edge.mu.Unlock()
	}
}

// An operator's boot mode is used over what the machine reported, until it is handed back; handed back, the
// mode known stays until the machine reports again, and then its report decides.
func TestSetPXEOnceOperatorBootMode(t *testing.T) {
	t.Parallel()

	edge := &siteEdge{}
	conn := serveEdge(t, func(srv *grpc.Server) { bmcpb.RegisterBMCServer(srv, edge) })

	const id = "4c4c4544-0042-3510-8052-b4c04f384836"

	locs := machines.NewLocations(zaptest.NewLogger(t))

	_, _, err := locs.OverrideFirmware(id, "uefi")
	require.ErrorIs(t, err, machines.ErrNotLocated, "a machine never seen has nothing to attach a mode to")

	_, err = locs.Seen("site-a", id)
	require.NoError(t, err)
	locs.SetFirmware(id, "bios", "dhcp")

	_, _, err = locs.OverrideFirmware(id, "efi")
	require.ErrorIs(t, err, machines.ErrBadFirmware)

	access := machineaccess.New(func(string) (grpc.ClientConnInterface, error) { return conn, nil }, locs.ByResourceID())
	bmc := &specs.BMCConfigurationSpec{Ipmi: &specs.BMCConfigurationSpec_IPMI{Address: "10.0.0.5", Port: 623, Username: "u", Password: "p"}}
	c := &machines.EdgeClients{Access: access, Sites: locs}

	pxe := func(step string) bmcpb.BootMode {
		edge.mu.Lock()
		edge.pxeMode = bmcpb.BootMode_BOOT_MODE_UNSPECIFIED
		edge.mu.Unlock()

		require.NoError(t, c.SetPXEOnce(t.Context(), "site-a", id, bmc), step)

		edge.mu.Lock()
		defer edge.mu.Unlock()

		return edge.pxeMode
	}

	require.Equal(t, bmcpb.BootMode_BOOT_MODE_BIOS, pxe("as reported"))

	fw, source, err := locs.OverrideFirmware(id, "uefi")
	require.NoError(t, err)
	require.Equal(t, []string{"uefi", "operator"}, []string{fw, source})

	locs.SetFirmware(id, "bios", "ipxe") // the machine's own report does not undo the operator's word
	require.Equal(t, bmcpb.BootMode_BOOT_MODE_UEFI, pxe("operator's mode"))

	fw, source, err = locs.OverrideFirmware(id, "") // auto
	require.NoError(t, err)
	require.Equal(t, []string{"uefi", ""}, []string{fw, source})
	require.Equal(t, bmcpb.BootMode_BOOT_MODE_UEFI, pxe("handed back, nothing reported since"))

	locs.SetFirmware(id, "bios", "dhcp")
	require.Equal(t, bmcpb.BootMode_BOOT_MODE_BIOS, pxe("reported after the hand-back"))
}

// serveEdge serves what register adds on a loopback gRPC server until the test ends and returns a client of it.
func serveEdge(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()

	srv := grpc.NewServer()
	register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	go srv.Serve(ln) //nolint:errcheck

	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	return conn
}
