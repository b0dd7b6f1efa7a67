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
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/qemu/realomni"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// StandInPort is the Omni stand-in's port in the core namespace (a real Omni's API is on the same one).
const StandInPort = 8099

// ProviderID is the infra provider ID the lab uses.
const ProviderID = "bare-metal"

// OmniMode chooses the lab's Omni: a real Omni (the default) or the stand-in.
type OmniMode string

// The lab's Omnis.
const (
	// RealOmni is a real Omni v1.9.3 (qemu/realomni) in the core namespace, offline, with auth on. It does what
	// a real Omni does with machines that are not Talos: it never collects their information (so it keeps them
	// powered on) and never hears of their installs (only a real Talos reaches its event sink).
	RealOmni OmniMode = "real"
	// StandInOmni is the stand-in (qemu/omni), told what a real Talos would report: information collected on
	// provision, install events from the lab machine's BMC channel. Fast, and the only way the lab shows
	// power-off after the cooldown, install events and installed machines booting their disk.
	StandInOmni OmniMode = "standin"
)

// OmniEnv is the environment variable that chooses the lab's Omni (real or standin).
const OmniEnv = "OMNI"

// ParseOmniMode parses the OMNI selector; empty is the default, RealOmni.
func ParseOmniMode(s string) (OmniMode, error) {
	switch m := OmniMode(strings.TrimSpace(s)); m {
	case "":
		return RealOmni, nil
	case RealOmni, StandInOmni:
		return m, nil
	default:
		return "", fmt.Errorf("%s=%q: want %s or %s", OmniEnv, s, RealOmni, StandInOmni)
	}
}

// LabKubernetesVersion is the Kubernetes version of the clusters the lab creates in a real Omni (one its fake
// registry lists, compatible with LabTalosVersion).
const LabKubernetesVersion = "v1.34.2"

// Omni is the lab's Omni, the stand-in or a real one, seen with the admin identity.
type Omni struct {
	// Mode says which Omni this is.
	Mode OmniMode
	// Endpoint is where the controller reaches Omni (grpc://10.99.0.1:8099 for the stand-in,
	// https://10.99.0.1:8099 for a real Omni).
	Endpoint string
	// ProviderKey is the infra provider's service-account key (for the controller).
	ProviderKey string
	// CAFile is the CA of a real Omni's self-signed certificate, for SSL_CERT_FILE of the processes that talk
	// to it (empty for the stand-in, which speaks plaintext).
	CAFile string
	// Admin performs user actions (InfraMachineConfig resources).
	Admin *omni.Admin
	// State is Omni's state as the admin sees it.
	State state.State
	// Proc is the stand-in process (nil for a real Omni).
	Proc *Proc
	// Real is the real Omni (nil for the stand-in).
	Real *realomni.Omni

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

	o.Mode, o.ProviderKey, o.Proc = StandInOmni, providerKey, p
	l.Defer(func() { o.client.Close() }) //nolint:errcheck

	return o, nil
}

// BuildRealOmni returns a real Omni's binaries for StartRealOmni (realomni.Build: cached under
// <root>/_out/omni; a cold build takes about 13 minutes on two cores).
func BuildRealOmni(ctx context.Context, root string, log *zap.Logger) (realomni.Binaries, error) {
	bins, err := realomni.Build(ctx, realomni.BuildOptions{RepoRoot: root, Logger: log})
	if err != nil {
		return realomni.Binaries{}, fmt.Errorf("build a real omni: %w", err)
	}

	return bins, nil
}

// StartRealOmni runs a real Omni (bins, BuildRealOmni) in the core namespace on CoreAddr, where the stand-in
// would listen (its API on StandInPort, SideroLink's machine API beside it; the machines reach both over
// their site's WAN link), creates the lab's infra provider as a user does (`omnictl infraprovider create`)
// and connects as admin. Its data and log (omni.log) are under <lab>/omni.
func (l *Lab) StartRealOmni(ctx context.Context, core *Core, bins realomni.Binaries) (*Omni, error) {
	ro, err := realomni.Start(ctx, realomni.Config{
		Dir: filepath.Join(l.Dir, "omni"), Netns: core.NS, IP: CoreAddr, Binaries: bins, Logger: l.log,
	})
	if err != nil {
		return nil, fmt.Errorf("start a real omni: %w", err)
	}

	l.Defer(ro.Stop)

	providerKey, err := ro.CreateProvider(ctx, ProviderID)
	if err != nil {
		return nil, err
	}

	// The lab's own admin client skips verification of Omni's self-signed certificate; the controller trusts
	// it through SSL_CERT_FILE (CAFile) instead.
	o, err := connectOmni(ro.Endpoint, ro.AdminKey(), DialerIn(core.NS), client.WithInsecureSkipTLSVerify(true))
	if err != nil {
		return nil, err
	}

	o.Mode, o.ProviderKey, o.CAFile, o.Real = RealOmni, providerKey, ro.CAFile, ro
	l.Defer(func() { o.client.Close() }) //nolint:errcheck

	return o, nil
}

// ConnectOmni connects to an Omni with the admin key (dial may be nil: the default dialer).
func ConnectOmni(endpoint, adminKey string, dial func(context.Context, string) (net.Conn, error)) (*Omni, error) {
	return connectOmni(endpoint, adminKey, dial)
}

func connectOmni(endpoint, adminKey string, dial func(context.Context, string) (net.Conn, error), extra ...client.Option) (*Omni, error) {
	opts := append([]client.Option{client.WithServiceAccount(adminKey)}, extra...)

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

// Allocate adds the machine to cluster as its one worker, Talos LabTalosVersion, as a user does: with a real
// Omni by `omnictl cluster template sync` (the template names the version with a v, Omni keeps it without),
// with the stand-in by writing the resources that sync writes.
func (o *Omni) Allocate(ctx context.Context, machineID, cluster string) error {
	if o.Real == nil {
		return o.Admin.Allocate(ctx, machineID, cluster, LabTalosVersion, nil, false)
	}

	return o.Real.AllocateWorker(ctx, cluster, LabKubernetesVersion, LabTalosVersion, machineID)
}

// Release releases the machine: with a real Omni its cluster is deleted (`omnictl cluster delete`), with the
// stand-in its node is removed from the cluster; Omni then sets a new wipe ID.
func (o *Omni) Release(ctx context.Context, machineID, cluster string) error {
	if o.Real == nil {
		return o.Admin.Release(ctx, machineID)
	}

	if err := o.Real.DeleteCluster(ctx, cluster); err != nil {
		return fmt.Errorf("release %s: %w", machineID, err)
	}

	return nil
}

// Log is the path of Omni's log.
func (o *Omni) Log() string {
	if o.Real != nil {
		return o.Real.Log()
	}

	if o.Proc != nil {
		return o.Proc.Log.Path
	}

	return ""
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
	// Conn reaches what the controller reaches over the uplink (siteedge serves it in place of one: boot
	// plans, BMC operations, assets and the agent call proxy).
	Conn *grpc.ClientConn
	// BootPlans is the edge's boot table service.
	BootPlans bootpb.BootPlansClient
}

// SiteEdgeControllerAPIPort is where siteedge serves what the controller would reach over the uplink.
const SiteEdgeControllerAPIPort = 50001

// StartSiteEdge runs qemu/lab/cmd/siteedge (binary bin: the edge without an uplink, the test playing the
// controller) on the site, serving assetsDir.
func (s *Site) StartSiteEdge(ctx context.Context, bin, assetsDir string) (*Edge, error) {
	ipxeDir, err := IPXEDir()
	if err != nil {
		return nil, err
	}

	p, err := s.lab.Start(ProcSpec{Name: s.Name + "/edge", NS: s.NS, Cmd: bin, Args: []string{
		"-iface", "br0", "-ip", s.EdgeIP(), "-state", filepath.Join(s.Dir, "edge-state"), "-assets", assetsDir,
		"-proxy-listen", fmt.Sprintf(":%d", SiteEdgeControllerAPIPort), "-ipxe-dir", ipxeDir, "-log-level", "debug",
	}})
	if err != nil {
		return nil, err
	}

	if err := p.WaitFor(ctx, "READY", 30*time.Second); err != nil {
		return nil, err
	}

	conn, err := grpc.NewClient(fmt.Sprintf("passthrough:///%s:%d", s.EdgeIP(), SiteEdgeControllerAPIPort),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(DialerIn(s.NS)))
	if err != nil {
		return nil, fmt.Errorf("dial edge of %s: %w", s.Name, err)
	}

	s.lab.Defer(func() { conn.Close() }) //nolint:errcheck

	return &Edge{Proc: p, Conn: conn, BootPlans: bootpb.NewBootPlansClient(conn)}, nil
}
