package omni

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Session is what runs on one connection to Omni: it returns when the connection is no longer usable (a
// broken watch, Omni gone) or when ctx ends. Everything it builds on conn must stop before it returns.
type Session func(ctx context.Context, conn *Connection) error

// Keeper keeps a connection to Omni and a session on it for as long as it runs: it connects, registers the
// provider, runs the session, and when the session ends for any reason but ctx ending (Omni restarted, a watch
// ran out of retries, a refused key an operator is still fixing), closes the connection and starts over with
// jittered exponential backoff. Nothing outside the session (edge sessions, boot tables) is touched.
//
// It exists because the COSI state client gives each watch a retry budget of 15 minutes that only a delivered
// message resets: a quiet watch older than that fails at once on the next disconnect, and a runtime built on
// it stops for good. Rebuilding the connection and the runtime is the only cure.
type Keeper struct {
	cfg     Config
	logger  *zap.Logger
	session Session
	metrics *KeeperMetrics

	// healthy is how long a session must have run for the next failure to start the backoff afresh.
	healthy time.Duration
}

// KeeperMetrics are the keeper's Prometheus metrics.
type KeeperMetrics struct {
	connected prometheus.Gauge
	sessions  *prometheus.CounterVec
	requests  *prometheus.CounterVec
}

// NewKeeperMetrics returns unregistered metrics: outpost_omni_connected (1 while a session runs),
// outpost_omni_sessions_ended_total{reason} and outpost_omni_requests_total{method}.
func NewKeeperMetrics() *KeeperMetrics {
	return &KeeperMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_omni_connected", Help: "1 while the controller is connected to Omni and its lifecycle runs.",
		}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_omni_sessions_ended_total", Help: "Omni connections that ended or failed, by reason.",
		}, []string{"reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_omni_requests_total",
			Help: "Requests the controller made to Omni's API, by method (Get, List, Watch, Create, Update, Destroy, ...).",
		}, []string{"method"}),
	}
}

// dialOptions count every request made on a connection to Omni (a watch counts once, when it starts).
func (m *KeeperMetrics) dialOptions() []grpc.DialOption {
	count := func(fullMethod string) {
		m.requests.WithLabelValues(path.Base(fullMethod)).Inc() // the method's name: a bounded set
	}

	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
		) error {
			count(method)

			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
			streamer grpc.Streamer, opts ...grpc.CallOption,
		) (grpc.ClientStream, error) {
			count(method)

			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// SessionsEnded is the counter of connections that ended for reason (bad_key, wrong_provider_id, tls,
// unreachable, session_ended).
func (m *KeeperMetrics) SessionsEnded(reason string) prometheus.Counter {
	return m.sessions.WithLabelValues(reason)
}

// Describe implements prometheus.Collector.
func (m *KeeperMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.connected.Describe(ch)
	m.sessions.Describe(ch)
	m.requests.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *KeeperMetrics) Collect(ch chan<- prometheus.Metric) {
	m.connected.Collect(ch)
	m.sessions.Collect(ch)
	m.requests.Collect(ch)
}

// NewKeeper returns a keeper running session on every connection. metrics may be nil.
func NewKeeper(cfg Config, logger *zap.Logger, metrics *KeeperMetrics, session Session) (*Keeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("omni config: %w", err)
	}

	if metrics == nil {
		metrics = NewKeeperMetrics()
	}

	cfg.DialOptions = append(slices.Clone(cfg.DialOptions), metrics.dialOptions()...)

	return &Keeper{
		cfg: cfg, logger: logger.With(zap.String("component", "omni")), session: session, metrics: metrics,
		healthy: time.Minute,
	}, nil
}

// Run keeps the session running until ctx ends; it returns nil then. It never gives up on Omni.
func (k *Keeper) Run(ctx context.Context) error {
	backoff := k.cfg.RetryMin

	for {
		started := time.Now()
		err := k.once(ctx)

		if ctx.Err() != nil {
			return nil
		}

		if time.Since(started) >= k.healthy {
			backoff = k.cfg.RetryMin
		}

		reason, hint := explain(err)
		k.metrics.sessions.WithLabelValues(reason).Inc()

		wait := jitter(backoff)
		k.logger.Warn("omni connection lost, reconnecting: "+hint, zap.String("endpoint", k.cfg.Endpoint),
			zap.String("reason", reason), zap.Duration("backoff", wait), zap.Error(err))

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}

		backoff = min(2*backoff, k.cfg.RetryMax)
	}
}

// once connects (one attempt), runs the session and closes the connection.
func (k *Keeper) once(ctx context.Context) error {
	conn, err := dial(ctx, k.cfg, k.logger)
	if err != nil {
		return err
	}

	defer conn.Close() //nolint:errcheck // a closed or broken client has nothing to report

	if err = conn.register(ctx); err != nil {
		return err
	}

	k.logger.Info("connected to omni", zap.String("endpoint", k.cfg.Endpoint), zap.String("provider_id", k.cfg.ProviderID))

	k.metrics.connected.Set(1)
	defer k.metrics.connected.Set(0)

	if err = k.session(ctx, conn); err != nil {
		return fmt.Errorf("omni session: %w", err)
	}

	if ctx.Err() == nil {
		return errors.New("omni session ended")
	}

	return nil
}

// explain names why a connection ended, for the metric label and a log line an operator can act on.
func explain(err error) (reason, hint string) {
	switch {
	case errors.Is(err, ErrBadKey):
		return "bad_key", "Omni refused the service-account key; create one with `omnictl infraprovider create <provider-id>` and set OMNI_SERVICE_ACCOUNT_KEY"
	case errors.Is(err, ErrWrongProviderID):
		return "wrong_provider_id", "the service-account key does not belong to this provider ID; check --provider-id"
	case errors.Is(err, ErrTLS):
		return "tls", "Omni's TLS certificate was not accepted; trust its CA (SSL_CERT_FILE) or check --omni-endpoint"
	case errors.Is(err, ErrUnreachable):
		return "unreachable", "Omni is unreachable"
	default:
		return "session_ended", "the Omni session ended (Omni restarted, or a watch broke)"
	}
}

// jitter spreads d over [d/2, d], so many controllers (or a restart of one) do not retry in step.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}

	return d/2 + rand.N(d/2+1) // timing jitter, not a secret
}
