package assets

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the controller's boot-asset counters: what it fetched from upstream and what it relayed to
// sites. The library and the relay count into them; the caller registers Collectors.
type Metrics struct {
	fetches      *prometheus.CounterVec
	fetchedBytes prometheus.Counter
	relayedBytes *prometheus.CounterVec
	relays       *prometheus.CounterVec
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_install_asset_fetches_total",
			Help: "Fetches of install assets from upstream (factory files and installer images) by outcome (held, failed).",
		}, []string{"outcome"}),
		fetchedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_install_asset_fetched_bytes_total",
			Help: "Bytes of install assets fetched from upstream.",
		}),
		relayedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_asset_relayed_bytes_total",
			Help: "Bytes of boot assets relayed to each site's edge.",
		}, []string{"site"}),
		relays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_asset_relays_total",
			Help: "Relay streams to each site's edge that sent an asset to its end.",
		}, []string{"site"}),
	}
}

// Collectors returns the metrics for the caller to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.fetches, m.fetchedBytes, m.relayedBytes, m.relays}
}

// Describe implements prometheus.Collector (all the metrics as one collector).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.Collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.Collectors() {
		c.Collect(ch)
	}
}
