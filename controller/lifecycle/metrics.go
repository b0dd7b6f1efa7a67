package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machines"
)

// Reasons counted by Metrics.
const (
	ReasonSiteOffline       = "site_offline"
	ReasonEdgeCallFailed    = "edge_call_failed"
	ReasonInvalidBMCConfig  = "invalid_bmc_config"
	ReasonMachineNotLocated = "machine_not_located"
	ReasonBMCRefused        = "bmc_refused"
	// ReasonBMCNotAnswering counts the power step's looks that left a BMC alone: it did not answer the last
	// try of the same wish, nor its edge's watch since.
	ReasonBMCNotAnswering = "bmc_not_answering"
)

// Metrics are the lifecycle's own: what it could not do, by reason; how long each controller's reconciles
// take; how long its calls through the edges (BMC and agent) take, by outcome. Labels are bounded: no
// machine or site among them. Register it with a prometheus registry.
type Metrics struct {
	problems   *prometheus.CounterVec
	reconciles *prometheus.HistogramVec
	edgeCalls  *prometheus.HistogramVec
}

// NewMetrics returns unregistered lifecycle metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		problems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outpost",
			Subsystem: "lifecycle",
			Name:      "problems_total",
			Help:      "Lifecycle operations that could not proceed, by reason.",
		}, []string{"reason"}),
		reconciles: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "outpost",
			Subsystem: "lifecycle",
			Name:      "reconcile_duration_seconds",
			Help:      "How long one reconcile of a machine took, by lifecycle controller (edge calls included).",
			Buckets:   prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5 ms to 131 s
		}, []string{"controller"}),
		edgeCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "outpost",
			Subsystem: "lifecycle",
			Name:      "edge_call_duration_seconds",
			Help:      "Calls through a site's edge to a machine's BMC or agent, by call and outcome (ok, site_offline, refused, timeout, error).",
			Buckets:   prometheus.ExponentialBuckets(0.002, 3, 10), // 2 ms to 39 s
		}, []string{"call", "outcome"}),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.problems.Describe(ch)
	m.reconciles.Describe(ch)
	m.edgeCalls.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.problems.Collect(ch)
	m.reconciles.Collect(ch)
	m.edgeCalls.Collect(ch)
}

func (m *Metrics) inc(reason string) { m.problems.WithLabelValues(reason).Inc() }

func (m *Metrics) edgeFailure(err error) {
	switch callOutcome(err) {
	case "site_offline":
		m.inc(ReasonSiteOffline)
	case "refused":
		m.inc(ReasonBMCRefused)
	default:
		m.inc(ReasonEdgeCallFailed)
	}
}

func (m *Metrics) reconciled(controller string, took time.Duration) {
	m.reconciles.WithLabelValues(controller).Observe(took.Seconds())
}

func (m *Metrics) called(call string, start time.Time, err error) {
	m.edgeCalls.WithLabelValues(call, callOutcome(err)).Observe(time.Since(start).Seconds())
}

// callOutcome classifies an edge call's result: a BMC's permanent refusal (wrong credentials, an unsupported
// command: the edge says FailedPrecondition) apart from a timeout, an offline site and other failures.
func callOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, machines.ErrSiteOffline):
		return "site_offline"
	case status.Code(err) == codes.FailedPrecondition:
		return "refused"
	case errors.Is(err, context.DeadlineExceeded), status.Code(err) == codes.DeadlineExceeded:
		return "timeout"
	default:
		return "error"
	}
}
