package lifecycle

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons counted by Metrics.
const (
	ReasonSiteOffline       = "site_offline"
	ReasonEdgeCallFailed    = "edge_call_failed"
	ReasonInvalidBMCConfig  = "invalid_bmc_config"
	ReasonMachineNotLocated = "machine_not_located"
	ReasonBMCRefused        = "bmc_refused"
)

// Metrics counts what the lifecycle could not do, by reason; register it with a prometheus registry.
type Metrics struct {
	problems *prometheus.CounterVec
}

// NewMetrics returns unregistered lifecycle metrics.
func NewMetrics() *Metrics {
	return &Metrics{problems: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "outpost",
		Subsystem: "lifecycle",
		Name:      "problems_total",
		Help:      "Lifecycle operations that could not proceed, by reason.",
	}, []string{"reason"})}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.problems.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.problems.Collect(ch) }

func (m *Metrics) inc(reason string) { m.problems.WithLabelValues(reason).Inc() }

func (m *Metrics) edgeFailure(err error) {
	switch {
	case errors.Is(err, ErrSiteOffline):
		m.inc(ReasonSiteOffline)
	case status.Code(err) == codes.FailedPrecondition:
		m.inc(ReasonBMCRefused)
	default:
		m.inc(ReasonEdgeCallFailed)
	}
}
