package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/client"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/qemu/omni"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// StandInPort is the Omni stand-in's port in the core namespace.
const StandInPort = 8099

// ProviderID is the infra provider ID the lab uses.
const ProviderID = "bare-metal"

// Omni is the lab's Omni: the stand-in (or, with OMNI_ENDPOINT, a real Omni) seen with the admin identity.
type Omni struct {
	// Endpoint is where the controller reaches Omni (grpc://10.99.0.1:8099 for the stand-in).
	Endpoint string
	// ProviderKey is the infra provider's service-account key (for the controller).
	ProviderKey string
	// Admin performs user actions (InfraMachineConfig resources).
	Admin *omni.Admin
	// State is Omni's state as the admin sees it.
	State state.State
	// Proc is the stand-in process (nil for a real Omni).
	Proc *Proc

	client *client.Client
}

// StartStandIn runs the Omni stand-in (binary bin) in the core namespace and connects to it as admin.
func (l *Lab) StartStandIn(ctx context.Context, core *Core, bin string) (*Omni, error) {
	addr := fmt.Sprintf("%s:%d", CoreAddr, StandInPort)
	keyDir := filepath.Join(l.Dir, "omni")

	p, err := l.Start(ProcSpec{Name: "omni-stand-in", NS: core.NS, Cmd: bin, Args: []string{
		"serve", "--listen", addr, "--advertise", addr, "--key-dir", keyDir, "--provider-id", ProviderID,
		// A real Omni collects a machine's information only from a real Talos over SideroLink, and keeps the
		// machine powered on until then; the lab's machines are not Talos, so the stand-in counts provisioning.
		"--collect-info-on-provision",
	}})
	if err != nil {
		return nil, err
	}

	if err := p.WaitFor(ctx, "omni stand-in serving", 30*time.Second); err != nil {
		return nil, err
	}

	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(keyDir, name))

		return strings.TrimSpace(string(b)), err
	}

	adminKey, err := read("admin.key")
	if err != nil {
		return nil, fmt.Errorf("read stand-in admin key: %w", err)
	}

	providerKey, err := read("provider.key")
	if err != nil {
		return nil, fmt.Errorf("read stand-in provider key: %w", err)
	}

	o, err := ConnectOmni("grpc://"+addr, adminKey, DialerIn(core.NS))
	if err != nil {
		return nil, err
	}

	o.ProviderKey, o.Proc = providerKey, p
	l.Defer(func() { o.client.Close() }) //nolint:errcheck,gosec

	return o, nil
}

// ConnectOmni connects to an Omni with the admin key (dial may be nil: the default dialer).
func ConnectOmni(endpoint, adminKey string, dial func(context.Context, string) (net.Conn, error)) (*Omni, error) {
	opts := []client.Option{client.WithServiceAccount(adminKey)}

	grpcOpts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.WaitForReady(true))}
	if dial != nil {
		grpcOpts = append(grpcOpts, grpc.WithContextDialer(dial))
	}

	opts = append(opts, client.WithGrpcOpts(grpcOpts...))

	c, err := client.New(endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to omni at %s: %w", endpoint, err)
	}

	st := c.Omni().State()

	return &Omni{Endpoint: endpoint, Admin: omni.NewAdmin(st), State: st, client: c}, nil
}

// JoinConfig returns the Talos config documents machines need to join (ProviderJoinConfig).
func (o *Omni) JoinConfig(ctx context.Context) ([]byte, error) {
	jc, err := safe.StateGetByID[*siderolink.ProviderJoinConfig](ctx, o.State, ProviderID)
	if err != nil {
		return nil, fmt.Errorf("read provider join config: %w", err)
	}

	return []byte(jc.TypedSpec().Value.GetConfig().GetConfig()), nil
}

// Edge is a running edge on a site.
type Edge struct {
	Proc *Proc
	// Conn reaches what the controller reaches over the uplink (the interim edge: BootPlans and the agent
	// call proxy).
	Conn *grpc.ClientConn
	// BootPlans is the edge's boot table service.
	BootPlans bootpb.BootPlansClient
}

// InterimEdgeProxyPort is where the interim edge serves what the controller would reach over the uplink.
const InterimEdgeProxyPort = 50001

// StartInterimEdge runs qemu/lab/cmd/siteedge (binary bin) on the site, serving assetsDir.
func (s *Site) StartInterimEdge(ctx context.Context, bin, assetsDir string) (*Edge, error) {
	p, err := s.lab.Start(ProcSpec{Name: s.Name + "/edge", NS: s.NS, Cmd: bin, Args: []string{
		"-iface", "br0", "-ip", s.EdgeIP(), "-state", filepath.Join(s.Dir, "edge-state"), "-assets", assetsDir,
		"-proxy-listen", fmt.Sprintf(":%d", InterimEdgeProxyPort), "-ipxe-dir", IPXEDir, "-log-level", "debug",
	}})
	if err != nil {
		return nil, err
	}

	if err := p.WaitFor(ctx, "READY", 30*time.Second); err != nil {
		return nil, err
	}

	conn, err := grpc.NewClient(fmt.Sprintf("passthrough:///%s:%d", s.EdgeIP(), InterimEdgeProxyPort),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(DialerIn(s.NS)))
	if err != nil {
		return nil, fmt.Errorf("dial edge of %s: %w", s.Name, err)
	}

	s.lab.Defer(func() { conn.Close() }) //nolint:errcheck,gosec

	return &Edge{Proc: p, Conn: conn, BootPlans: bootpb.NewBootPlansClient(conn)}, nil
}
