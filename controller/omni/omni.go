// Package omni connects the controller to Omni as a static infra provider: it opens the Omni API with the
// provider's service account, registers the provider (ProviderStatus with the static-provider label), keeps
// its health heartbeat and runs a COSI runtime on Omni's state for the lifecycle controllers.
package omni

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/controller/runtime"
	"github.com/cosi-project/runtime/pkg/controller/runtime/options"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/siderolabs/omni/client/pkg/access"
	"github.com/siderolabs/omni/client/pkg/client"
	clientomni "github.com/siderolabs/omni/client/pkg/client/omni"
	"github.com/siderolabs/omni/client/pkg/infra/controllers"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/shared/version"
)

// Sentinel errors of Connect, for callers (and operators) to tell start-up failures apart.
var (
	// ErrUnreachable means Omni did not answer before the connect deadline.
	ErrUnreachable = errors.New("omni unreachable")
	// ErrBadKey means Omni refused the service-account key (unknown, malformed or expired).
	ErrBadKey = errors.New("omni refused the service-account key")
	// ErrWrongProviderID means the key does not belong to the configured provider ID.
	ErrWrongProviderID = errors.New("service-account key does not belong to this provider ID")
	// ErrTLS means Omni's TLS certificate was not accepted (unknown CA: trust it, or skip verification in a lab).
	ErrTLS = errors.New("omni's tls certificate was not accepted")
)

// Config says how to reach Omni and who the provider is.
type Config struct {
	// Endpoint is Omni's API URL (https:// for TLS, grpc:// or http:// for plaintext).
	Endpoint string
	// ServiceAccountKey is the base64 key printed by `omnictl infraprovider create <ProviderID>`.
	ServiceAccountKey string
	// InsecureSkipVerify skips TLS certificate verification (lab use only).
	InsecureSkipVerify bool
	// ProviderID is the infra provider ID the key was created for.
	ProviderID  string
	Name        string
	Description string
	// HealthInterval is how often the health heartbeat (with the sites' state) is written.
	HealthInterval time.Duration
	// ConnectTimeout bounds how long Connect keeps retrying an unreachable Omni (0: until ctx ends).
	ConnectTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between connection attempts.
	RetryMin, RetryMax time.Duration
	// DialOptions are added to the gRPC client's (embedding and tests: a dialer into a network namespace).
	DialOptions []grpc.DialOption
}

// Default returns the defaults: provider ID bare-metal, 1 s to 30 s backoff.
func Default() Config {
	return Config{
		ProviderID:  "bare-metal",
		Name:        "Outpost",
		Description: "Multi-site bare-metal provisioning (static infra provider)",
		RetryMin:    time.Second,
		RetryMax:    30 * time.Second,
		// An offline site shows in Omni within the uplink's keepalive (about 30 s) plus this.
		HealthInterval: 15 * time.Second,
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Endpoint == "" {
		return errors.New("omni endpoint is empty (set --omni-endpoint or OMNI_ENDPOINT)")
	}

	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return fmt.Errorf("omni endpoint %q: %w", c.Endpoint, err)
	}

	switch u.Scheme {
	case "https", "http", "grpc":
	default:
		return fmt.Errorf("omni endpoint %q: scheme must be https, http or grpc", c.Endpoint)
	}

	if c.ServiceAccountKey == "" {
		return errors.New("service-account key is empty (set OMNI_SERVICE_ACCOUNT_KEY)")
	}

	sa, err := serviceaccount.Decode(c.ServiceAccountKey)
	if err != nil {
		return fmt.Errorf("%w: cannot decode it: %w", ErrBadKey, err)
	}

	if c.ProviderID == "" {
		return errors.New("provider ID is empty")
	}

	// an infra provider's key names it: <id>@infra-provider.serviceaccount.omni.sidero.dev
	if acct, ok := access.ParseServiceAccountFromFullID(sa.Name); ok && acct.IsInfraProvider && acct.BaseName != c.ProviderID {
		return fmt.Errorf("%w: the key is for provider %q, the configured provider ID is %q", ErrWrongProviderID, acct.BaseName, c.ProviderID)
	}

	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		return errors.New("retry backoff bounds are invalid")
	}

	return nil
}

// Connection is an open, registered connection to Omni.
type Connection struct {
	cfg    Config
	client *client.Client
	logger *zap.Logger
	types  resources.Types
}

// Connect opens the Omni API and registers the provider, retrying with backoff while Omni is unreachable.
// A refused key or a key of another provider fails at once with ErrBadKey or ErrWrongProviderID.
// A controller that must survive Omni going away at any time runs a Keeper instead.
func Connect(ctx context.Context, cfg Config, logger *zap.Logger) (*Connection, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("omni config: %w", err)
	}

	logger = logger.With(zap.String("component", "omni"))

	conn, err := dial(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}

	if cfg.ConnectTimeout > 0 {
		var cancel context.CancelFunc

		ctx, cancel = context.WithTimeout(ctx, cfg.ConnectTimeout)
		defer cancel()
	}

	backoff := cfg.RetryMin

	for {
		err = conn.register(ctx)
		if err == nil {
			logger.Info("registered with omni", zap.String("endpoint", cfg.Endpoint), zap.String("provider_id", cfg.ProviderID))

			return conn, nil
		}

		if !errors.Is(err, ErrUnreachable) {
			conn.Close() //nolint:errcheck

			return nil, err
		}

		logger.Warn("omni unreachable, retrying", zap.String("endpoint", cfg.Endpoint), zap.Duration("backoff", backoff), zap.Error(err))

		select {
		case <-ctx.Done():
			conn.Close() //nolint:errcheck

			return nil, fmt.Errorf("connect to omni at %s: %w", cfg.Endpoint, err)
		case <-time.After(backoff):
		}

		backoff = min(2*backoff, cfg.RetryMax)
	}
}

// dial creates the Omni client (no RPC is made yet) and registers the provider's own resource types.
func dial(_ context.Context, cfg Config, logger *zap.Logger) (*Connection, error) {
	types := resources.NewTypes(cfg.ProviderID)
	if err := types.Register(); err != nil {
		return nil, fmt.Errorf("register resource types: %w", err)
	}

	c, err := client.New(cfg.Endpoint,
		client.WithServiceAccount(cfg.ServiceAccountKey),
		client.WithInsecureSkipTLSVerify(cfg.InsecureSkipVerify),
		client.WithOmniClientOptions(clientomni.WithProviderID(cfg.ProviderID), clientomni.WithRetryLogger(logger)),
		client.WithGrpcOpts(cfg.DialOptions...),
	)
	if err != nil {
		return nil, fmt.Errorf("create omni client for %s: %w", cfg.Endpoint, err)
	}

	return &Connection{cfg: cfg, client: c, logger: logger, types: types}, nil
}

// classify maps an Omni API error to the sentinel errors.
func classify(err error) error {
	if err == nil {
		return nil
	}

	switch {
	case state.IsOwnerConflictError(err), state.IsPhaseConflictError(err):
		return fmt.Errorf("%w: %w", ErrWrongProviderID, err)
	}

	switch status.Code(err) {
	case codes.Unavailable:
		if msg := status.Convert(err).Message(); strings.Contains(msg, "certificate") || strings.Contains(msg, "x509") {
			return fmt.Errorf("%w: %w", ErrTLS, err)
		}

		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case codes.Unauthenticated:
		return fmt.Errorf("%w: %w", ErrBadKey, err)
	case codes.InvalidArgument, codes.PermissionDenied:
		return fmt.Errorf("%w: %w", ErrWrongProviderID, err)
	}

	return err
}

// register writes the ProviderStatus marked as a static provider. Another controller of the provider (a
// standby) may write it at the same moment: a conflict is retried on the fresh resource.
func (c *Connection) register(ctx context.Context) error {
	attemptCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	ps := infra.NewProviderStatus(c.cfg.ProviderID)

	var err error

	for range 3 {
		err = safe.StateModify(attemptCtx, c.State(), ps, func(r *infra.ProviderStatus) error {
			r.Metadata().Labels().Set(omnires.LabelIsStaticInfraProvider, "")
			r.TypedSpec().Value.Name = c.cfg.Name
			r.TypedSpec().Value.Description = c.cfg.Description + " " + version.String()

			return nil
		})
		if err == nil || !state.IsConflictError(err) {
			break
		}
	}

	if err != nil {
		return fmt.Errorf("register provider %q: %w", c.cfg.ProviderID, classify(err))
	}

	return nil
}

// State is Omni's state as this provider sees it.
func (c *Connection) State() state.State { return c.client.Omni().State() }

// Types are the provider's own resource types.
func (c *Connection) Types() resources.Types { return c.types }

// Close closes the connection.
func (c *Connection) Close() error { return c.client.Close() }

// LocalNamespaces is implemented by a controller that keeps records in namespaces of its own that live in
// this process only (lifecycle's due records): the runtime serves those from memory, never from Omni.
type LocalNamespaces interface {
	LocalNamespaces() []resource.Namespace
}

// CachedReads is implemented by a controller that also reads kinds it does not take as inputs (its own
// outputs, to write only what changed) and wants those reads served from the cache too.
type CachedReads interface {
	CachedReads() []resource.Kind
}

// localNamespaces are the namespaces the controllers keep in memory.
func localNamespaces(qcontrollers []controller.QController) map[resource.Namespace]bool {
	local := map[resource.Namespace]bool{}

	for _, qc := range qcontrollers {
		if l, ok := qc.(LocalNamespaces); ok {
			for _, ns := range l.LocalNamespaces() {
				local[ns] = true
			}
		}
	}

	return local
}

// CachedInputs returns the runtime options that serve every input kind of the controllers, and every kind
// they declare as CachedReads, from the runtime's watch-fed cache. Kinds in a controller's local namespaces
// are left out (they are in memory already).
func CachedInputs(qcontrollers ...controller.QController) []options.Option {
	type kind struct {
		ns  resource.Namespace
		typ resource.Type
	}

	var opts []options.Option

	local := localNamespaces(qcontrollers)
	cached := map[kind]bool{}

	add := func(ns resource.Namespace, typ resource.Type) {
		if k := (kind{ns, typ}); !cached[k] && !local[ns] {
			cached[k] = true

			opts = append(opts, options.WithCachedResource(ns, typ))
		}
	}

	for _, qc := range qcontrollers {
		for _, in := range qc.Settings().Inputs {
			add(in.Namespace, in.Type)
		}

		if c, ok := qc.(CachedReads); ok {
			for _, k := range c.CachedReads() {
				add(k.Namespace(), k.Type())
			}
		}
	}

	return opts
}

// localHistory bounds the events kept per kind of a local namespace for a watcher that falls behind.
const localHistory = 65536

// WithLocalNamespaces returns st with the controllers' local namespaces served from memory (one in-memory
// state per namespace, for the life of the returned state) and every other namespace from st.
func WithLocalNamespaces(st state.CoreState, qcontrollers ...controller.QController) state.State {
	local := localNamespaces(qcontrollers)

	return state.WrapCore(namespaced.NewState(func(ns resource.Namespace) state.CoreState {
		if local[ns] {
			// room for every machine's record to be touched at once (a whole fleet due together) before the
			// runtime's watch reads them: a watcher that falls further behind fails, and the runtime with it
			return inmem.NewStateWithOptions(inmem.WithHistoryInitialCapacity(1024), inmem.WithHistoryMaxCapacity(localHistory),
				inmem.WithHistoryGap(20))(ns)
		}

		return st
	}))
}

// NewRuntime returns a COSI runtime on Omni's state with the health heartbeat controller and the given
// controllers registered; run it with Run(ctx). health (optional) is checked before every heartbeat; its error
// is what Omni shows as the provider's health (e.g. "no site connected").
//
// Every kind a controller declares as an input is read from the runtime's watch-fed cache, not from Omni: a
// reconcile's reads cost no round trip, and Omni serves one watch per kind however many machines there are.
// A controller's local namespaces (LocalNamespaces) are kept in this process's memory.
func (c *Connection) NewRuntime(health func(context.Context) error, qcontrollers ...controller.QController) (*runtime.Runtime, error) {
	opts := append(CachedInputs(qcontrollers...), options.WithMetrics(true))

	rt, err := runtime.NewRuntime(WithLocalNamespaces(c.State(), qcontrollers...), runtimeLogger(c.logger), opts...)
	if err != nil {
		return nil, fmt.Errorf("create runtime: %w", err)
	}

	heartbeat, err := controllers.NewProviderHealthStatusController(c.cfg.ProviderID, controllers.ProviderHealthStatusOptions{
		Interval:        c.cfg.HealthInterval,
		HealthCheckFunc: health,
	})
	if err != nil {
		return nil, fmt.Errorf("health controller: %w", err)
	}

	if err = rt.RegisterController(heartbeat); err != nil {
		return nil, fmt.Errorf("register health controller: %w", err)
	}

	for _, qc := range qcontrollers {
		if err = rt.RegisterQController(qc); err != nil {
			return nil, fmt.Errorf("register %s: %w", qc.Name(), err)
		}
	}

	return rt, nil
}

// RuntimeMetrics exposes what the COSI runtime counts of each controller it runs (NewRuntime turns its
// counting on): the queue of machines waiting for a reconcile, reconciles done and requeued, and the time spent
// reconciling. The runtime keeps these process-wide, labelled by controller name (a bounded set).
func RuntimeMetrics() prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"controller"}, nil)
	}

	return collectors.NewExpvarCollector(map[string]*prometheus.Desc{
		"qcontroller_queue_length": desc("outpost_lifecycle_queue_length",
			"Machines waiting in a lifecycle controller's queue for a reconcile."),
		"qcontroller_processed": desc("outpost_lifecycle_reconciles_total",
			"Reconciles a lifecycle controller finished."),
		"qcontroller_requeues": desc("outpost_lifecycle_requeues_total",
			"Reconciles a lifecycle controller asked to run again (failed or waiting)."),
		"qcontroller_reconcile_busy": desc("outpost_lifecycle_reconcile_busy_seconds_total",
			"Time a lifecycle controller's workers spent reconciling."),
	})
}
