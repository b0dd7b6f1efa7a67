package omni_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/client"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/qemu/omni"
)

// standIn is a running stand-in on loopback.
type standIn struct {
	*omni.Server
	endpoint string
	addr     string
	cancel   context.CancelFunc
	done     chan error
}

func startStandIn(t *testing.T, cfg omni.Config) *standIn {
	t.Helper()

	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}

	srv, err := omni.New(cfg)
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	s := &standIn{Server: srv, endpoint: "grpc://" + ln.Addr().String(), addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}

	go func() { s.done <- srv.Serve(ctx, ln) }()

	t.Cleanup(s.stop)

	// serving starts by seeding Omni's resources
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()

	_, err = s.State().WatchFor(wctx, siderolink.NewProviderJoinConfig(cfg.ProviderID).Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)

	return s
}

func (s *standIn) stop() {
	if s.cancel == nil {
		return
	}

	s.cancel()
	<-s.done
	s.Close() //nolint:errcheck
	s.cancel = nil
}

func (s *standIn) client(t *testing.T, key string) state.State {
	t.Helper()

	c, err := client.New(s.endpoint, client.WithServiceAccount(key))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	return c.Omni().State()
}

// provision calls SideroLink Provision as a machine's agent does, with the provider's join token.
func (s *standIn) provision(t *testing.T, ctx context.Context, uuid string) (*pb.ProvisionResponse, error) {
	t.Helper()

	jc, err := safe.StateGetByID[*siderolink.ProviderJoinConfig](ctx, s.State(), "bare-metal")
	require.NoError(t, err)

	token, err := omni.MachineJoinToken(jc)
	require.NoError(t, err)

	return provisionWith(ctx, s.addr, uuid, token)
}

// nodeToken is the node unique token a machine sends, as Talos does: JSON with a fingerprint and a token.
func nodeToken(uuid string) string {
	return `{"Fingerprint":"fp-` + uuid + `","Token":"node-token-` + uuid + `"}`
}

func provisionWith(ctx context.Context, addr, uuid, token string) (*pb.ProvisionResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}

	defer conn.Close() //nolint:errcheck

	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, err
	}

	return pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
		NodeUuid: uuid, NodePublicKey: key.PublicKey().String(), JoinToken: &token, NodeUniqueToken: new(nodeToken(uuid)),
		TalosVersion: new("v1.11.0"),
	})
}

func TestProvisionCreatesPendingInfraMachine(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())

	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	m, err := safe.StateWatchFor[*infra.Machine](ctx, s.State(), infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Created, state.Updated))
	require.NoError(t, err)

	require.Equal(t, "bare-metal", m.Metadata().Labels().Raw()[omnires.LabelInfraProviderID])
	require.Contains(t, m.Metadata().Labels().Raw(), omnires.LabelMachinePendingAccept)
	require.Equal(t, specs.InfraMachineConfigSpec_PENDING, m.TypedSpec().Value.AcceptanceStatus)
	require.Equal(t, nodeToken("m-1"), m.TypedSpec().Value.NodeUniqueToken)

	// a bad join token is refused
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	_, err = pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{NodeUuid: "m-2", JoinToken: new("garbage")})
	require.Error(t, err)
}

func TestProviderIsScoped(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())
	prov := s.client(t, s.ProviderKey())

	for _, tc := range []struct {
		name string
		do   func() error
		ok   bool
	}{
		{name: "own provider status", ok: true, do: func() error { return prov.Create(ctx, infra.NewProviderStatus("bare-metal")) }},
		{name: "other provider status", do: func() error { return prov.Create(ctx, infra.NewProviderStatus("other")) }},
		{name: "create infra machine", do: func() error { return prov.Create(ctx, infra.NewMachine("x")) }},
		{name: "status of an unknown machine", do: func() error { return prov.Create(ctx, infra.NewMachineStatus("x")) }},
		{name: "read default namespace", do: func() error {
			_, err := prov.List(ctx, siderolink.NewLink("", nil).Metadata())

			return err
		}},
		{name: "read join config", ok: true, do: func() error {
			_, err := prov.Get(ctx, siderolink.NewProviderJoinConfig("bare-metal").Metadata())

			return err
		}},
		{name: "other provider namespace", do: func() error {
			_, err := prov.List(ctx, resource.NewMetadata("infra-provider:other", "X.other.infraprovider.sidero.dev", "", resource.VersionUndefined))

			return err
		}},
	} {
		err := tc.do()
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.Error(t, err, tc.name)
		}
	}

	// the provider may add finalizers to an InfraMachine but not change it
	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	_, err = safe.StateWatchFor[*infra.Machine](ctx, s.State(), infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Created))
	require.NoError(t, err)
	require.NoError(t, prov.AddFinalizer(ctx, infra.NewMachine("m-1").Metadata(), "outpost"))
	require.NoError(t, prov.Create(ctx, infra.NewMachineStatus("m-1")), "status of its own machine")

	_, err = safe.StateUpdateWithConflicts(ctx, prov, infra.NewMachine("m-1").Metadata(), func(m *infra.Machine) error {
		m.TypedSpec().Value.Cordoned = true

		return nil
	})
	require.Error(t, err)

	// an unknown key is refused
	key, err := pgp.GenerateKey(omni.ProviderIdentity("bare-metal"), "", omni.ProviderIdentity("bare-metal"), time.Hour)
	require.NoError(t, err)
	enc, err := serviceaccount.Encode(omni.ProviderIdentity("bare-metal"), key)
	require.NoError(t, err)

	_, err = s.client(t, enc).Get(ctx, infra.NewProviderStatus("bare-metal").Metadata())
	require.ErrorContains(t, err, "Unauthenticated")
}

func TestDerivation(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	cfg := omni.Default()
	cfg.CollectInfoOnProvision = false
	s := startStandIn(t, cfg)
	admin := omni.NewAdmin(s.client(t, s.AdminKey()))

	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	waitMachine := func(name string, cond func(*infra.Machine) bool) *infra.Machine {
		t.Helper()

		m, err := safe.StateWatchFor[*infra.Machine](ctx, s.State(), infra.NewMachine("m-1").Metadata(),
			state.WithCondition(func(r resource.Resource) (bool, error) { return cond(r.(*infra.Machine)), nil }))
		require.NoError(t, err, name)

		return m
	}

	require.NoError(t, admin.Accept(ctx, "m-1"))
	waitMachine("accepted, forced on before info", func(m *infra.Machine) bool {
		return m.TypedSpec().Value.AcceptanceStatus == specs.InfraMachineConfigSpec_ACCEPTED &&
			m.TypedSpec().Value.PreferredPowerState == specs.InfraMachineSpec_POWER_STATE_ON
	})

	require.NoError(t, admin.CollectInfo(ctx, "m-1", "v1.11.0"))
	waitMachine("default power off after info", func(m *infra.Machine) bool {
		return m.TypedSpec().Value.PreferredPowerState == specs.InfraMachineSpec_POWER_STATE_OFF
	})

	_, err = admin.PowerOff(ctx, "m-1")
	require.NoError(t, err)

	require.NoError(t, admin.Allocate(ctx, "m-1", "c1", "v1.11.0", []string{"siderolabs/iscsi-tools"}, true))
	m := waitMachine("allocated", func(m *infra.Machine) bool { return m.TypedSpec().Value.ClusterTalosVersion == "v1.11.0" })
	require.Equal(t, []string{"siderolabs/iscsi-tools"}, m.TypedSpec().Value.Extensions)
	require.NotEmpty(t, m.TypedSpec().Value.PowerOffRequestId, "power-off request kept while allocated")
	require.Equal(t, "c1", m.Metadata().Labels().Raw()[omnires.LabelCluster])
	require.Contains(t, m.Metadata().Labels().Raw(), omnires.LabelControlPlaneRole)

	wipeBefore := m.TypedSpec().Value.WipeId

	require.NoError(t, admin.ReportInstalled(ctx, "m-1"))
	waitMachine("install counted", func(m *infra.Machine) bool { return m.TypedSpec().Value.InstallEventId == 1 })

	require.NoError(t, admin.Release(ctx, "m-1"))
	m = waitMachine("released", func(m *infra.Machine) bool { return m.TypedSpec().Value.ClusterTalosVersion == "" })
	require.NotEqual(t, wipeBefore, m.TypedSpec().Value.WipeId, "new wipe ID on release")
	require.Empty(t, m.TypedSpec().Value.PowerOffRequestId, "power-off request cleared while unallocated")
	require.NotContains(t, m.Metadata().Labels().Raw(), omnires.LabelCluster)

	require.NoError(t, admin.Delete(ctx, "m-1"))
	_, err = s.State().WatchFor(ctx, infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Destroyed))
	require.NoError(t, err)
}

func TestPersistence(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	cfg := omni.Default()
	cfg.StateDir = t.TempDir()

	s := startStandIn(t, cfg)
	key := s.ProviderKey()

	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	_, err = safe.StateWatchFor[*infra.Machine](ctx, s.State(), infra.NewMachine("m-1").Metadata(), state.WithEventTypes(state.Created))
	require.NoError(t, err)
	s.stop()

	s2 := startStandIn(t, cfg)
	require.Equal(t, key, s2.ProviderKey(), "keys survive a restart")

	_, err = safe.StateGetByID[*infra.Machine](ctx, s2.State(), "m-1")
	require.NoError(t, err)
}

// Provision checks what Omni checks: the node unique token is Talos's JSON, the public key a WireGuard key, the
// join token the machine-facing one (the spec's join_token is the provider's raw secret and is refused).
func TestProvisionIsStrict(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())

	jc, err := safe.StateGetByID[*siderolink.ProviderJoinConfig](ctx, s.State(), "bare-metal")
	require.NoError(t, err)

	machineToken, err := omni.MachineJoinToken(jc)
	require.NoError(t, err)
	require.NotContains(t, jc.TypedSpec().Value.JoinToken, ":", "the spec holds the raw secret, not a versioned token")
	require.InDelta(t, 44, len(jc.TypedSpec().Value.JoinToken), 2, "a base62 secret of 32 bytes")
	require.NotEqual(t, machineToken, jc.TypedSpec().Value.JoinToken)

	key, err := wgtypes.GeneratePrivateKey()
	require.NoError(t, err)

	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	for _, tc := range []struct {
		name                  string
		token, unique, pubkey string
		code                  codes.Code
		contains              string
	}{
		{name: "as talos does", token: machineToken, unique: nodeToken("m-ok"), pubkey: key.PublicKey().String(), code: codes.OK},
		{name: "hex node token", token: machineToken, unique: "a1b2c3d4e5f60718", pubkey: key.PublicKey().String(),
			code: codes.PermissionDenied, contains: "invalid character"},
		{name: "not a wireguard key", token: machineToken, unique: nodeToken("m-1"), pubkey: "cHVibGljLWtleQ==",
			code: codes.InvalidArgument, contains: "error parsing Wireguard key"},
		{name: "raw secret as join token", token: jc.TypedSpec().Value.JoinToken, unique: nodeToken("m-1"), pubkey: key.PublicKey().String(),
			code: codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pb.NewProvisionServiceClient(conn).Provision(ctx, &pb.ProvisionRequest{
				NodeUuid: "m-1", NodePublicKey: tc.pubkey, JoinToken: &tc.token, NodeUniqueToken: &tc.unique, TalosVersion: new("v1.11.5"),
			})
			require.Equal(t, tc.code, status.Code(err), "%v", err)

			if tc.contains != "" {
				require.ErrorContains(t, err, tc.contains)
			}
		})
	}
}

// Accepted is final in Omni: an accepted machine cannot be rejected or set back to pending.
func TestAcceptedIsFinal(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	s := startStandIn(t, omni.Default())
	admin := omni.NewAdmin(s.client(t, s.AdminKey()))

	_, err := s.provision(t, ctx, "m-1")
	require.NoError(t, err)

	require.NoError(t, admin.Reject(ctx, "m-1"), "a pending machine can be rejected")
	require.NoError(t, admin.Accept(ctx, "m-1"), "and accepted after all")

	err = admin.Reject(ctx, "m-1")
	require.ErrorContains(t, err, "InvalidArgument")
	require.ErrorContains(t, err, "an accepted machine cannot be rejected")
}
