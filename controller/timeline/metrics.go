package timeline

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	machines      prometheus.Gauge
	dropped       prometheus.Counter
	refused       *prometheus.CounterVec
	writes        prometheus.Counter
	writeFailures prometheus.Counter
	pending       prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		machines: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "machines",
			Help: "Machines with a timeline.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "entries_dropped_total",
			Help: "Oldest timeline entries dropped to keep each machine's timeline bounded.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "events_refused_total",
			Help: "Edge events not added to any timeline, by reason.",
		}, []string{"reason"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "writes_total",
			Help: "Machine timelines written to Omni.",
		}),
		writeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "write_failures_total",
			Help: "Machine timeline writes to Omni that failed (retried at the next pass).",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "outpost", Subsystem: "timeline", Name: "pending_writes",
			Help: "Machine timelines changed and not yet written to Omni, as the last write pass left them.",
		}),
	}
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.machines, m.dropped, m.refused, m.writes, m.writeFailures, m.pending}
}

func (m *metrics) describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all() {
		c.Describe(ch)
	}
}

func (m *metrics) collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all() {
		c.Collect(ch)
	}
}
