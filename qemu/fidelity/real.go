package fidelity

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/pkg/client"
	"google.golang.org/grpc"

	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// Real is a real Omni v1.9.3 as a Backend. The provider's key comes from `omnictl infraprovider create`, a
// cluster is made with `omnictl cluster template sync`, as a user does; everything is reached inside Omni's
// network namespace.
type Real struct {
	o           *realomni.Omni
	providerID  string
	providerKey string
	admin       *client.Client
	reader      *client.Client
}

// NewReal wraps a running real Omni: it creates the infra provider and an admin client.
func NewReal(ctx context.Context, o *realomni.Omni, providerID string) (*Real, error) {
	key, err := o.CreateProvider(ctx, providerID)
	if err != nil {
		return nil, err
	}

	admin, err := client.New(o.Endpoint, client.WithServiceAccount(o.AdminKey()), client.WithInsecureSkipTLSVerify(true),
		client.WithGrpcOpts(grpc.WithContextDialer(o.DialContext)))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}

	return &Real{o: o, providerID: providerID, providerKey: key, admin: admin}, nil
}

// Omni is the running Omni (to restart it).
func (r *Real) Omni() *realomni.Omni { return r.o }

// Close closes the clients (the Omni itself is its owner's to stop).
func (r *Real) Close() error {
	if r.reader != nil {
		r.reader.Close() //nolint:errcheck // the admin's error is the one reported
	}

	return r.admin.Close()
}

// Reader implements Backend: a service account with Omni's Reader role, created on first use.
func (r *Real) Reader(ctx context.Context) (state.State, error) {
	if r.reader == nil {
		key, err := r.o.CreateServiceAccount(ctx, "fidelity-reader", "Reader")
		if err != nil {
			return nil, err
		}

		c, err := client.New(r.o.Endpoint, client.WithServiceAccount(key), client.WithInsecureSkipTLSVerify(true),
			client.WithGrpcOpts(grpc.WithContextDialer(r.o.DialContext)))
		if err != nil {
			return nil, fmt.Errorf("reader client: %w", err)
		}

		r.reader = c
	}

	return r.reader.Omni().State(), nil
}

// Name implements Backend.
func (r *Real) Name() string { return "real Omni " + realomni.Version }

// Controller implements Backend. Omni's certificate is the lab's self-signed one: the in-process controller
// skips verification (the controller binary in the lab trusts it through SSL_CERT_FILE instead).
func (r *Real) Controller() controlleromni.Config {
	cfg := controlleromni.Default()
	cfg.Endpoint = r.o.Endpoint
	cfg.ServiceAccountKey = r.providerKey
	cfg.ProviderID = r.providerID
	cfg.InsecureSkipVerify = true
	cfg.HealthInterval = time.Second
	cfg.RetryMin, cfg.RetryMax = 100*time.Millisecond, 2*time.Second
	cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(r.o.DialContext)}

	return cfg
}

// Admin implements Backend.
func (r *Real) Admin() state.State { return r.admin.Omni().State() }

// Dial implements Backend.
func (r *Real) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return r.o.DialContext(ctx, addr)
}

// Allocate implements Backend: a cluster template with the machine as its one worker.
func (r *Real) Allocate(ctx context.Context, machineID, cluster, talosVersion string) error {
	return r.o.AllocateWorker(ctx, cluster, "1.34.2", talosVersion, machineID)
}

// Release implements Backend: the cluster is deleted, as `omnictl cluster delete` does.
func (r *Real) Release(ctx context.Context, _, cluster string) error {
	return r.o.DeleteCluster(ctx, cluster)
}

// CollectInfo implements Backend: a real Omni collects machine information only from a real Talos, over the
// Talos API through SideroLink WireGuard; the scenario's machines are not Talos.
func (r *Real) CollectInfo(context.Context, string) error {
	return fmt.Errorf("%w: Omni collects machine information only from a real Talos over SideroLink", ErrNotPossible)
}

// RemoveLink implements Backend.
func (r *Real) RemoveLink(ctx context.Context, machineID string) error {
	return removeLink(ctx, r.Admin(), machineID)
}
