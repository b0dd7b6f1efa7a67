package assetcache

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	errors       *prometheus.CounterVec
	bytesFetched *prometheus.CounterVec
	bytesServed  prometheus.Counter
	evictions    prometheus.Counter
	bytesUsed    prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_asset_errors_total",
			Help: "Asset cache errors by reason (digest_mismatch, size_mismatch, disk_full, no_space, corrupt, bad_name, traversal, source, bad_ref, write).",
		}, []string{"reason"}),
		bytesFetched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_asset_fetched_bytes_total",
			Help: "Bytes written into the asset cache by source (http, relay, import).",
		}, []string{"source"}),
		bytesServed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_edge_asset_requests_total",
			Help: "Requests answered from /assets/.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_edge_asset_evictions_total",
			Help: "Assets evicted to stay under the size cap.",
		}),
		bytesUsed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_edge_asset_cache_bytes",
			Help: "Bytes taken by cached assets.",
		}),
	}
}

// Collectors returns the store's prometheus collectors for the caller to register.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.errors, s.metrics.bytesFetched, s.metrics.bytesServed, s.metrics.evictions, s.metrics.bytesUsed}
}

// countStopped counts an error that stopped a download for good: the cache's own failures as countError,
// anything else as the source's (it refused the asset: the relay does not know it, a URL is malformed).
func (m *metrics) countStopped(err error) {
	if IsDiskFull(err) || errors.Is(err, errWrite) || errors.Is(err, ErrSizeMismatch) {
		m.countError(err)

		return
	}

	m.errors.WithLabelValues("source").Inc()
}

// countError counts an error that stopped an asset from being written into the cache: disk_full,
// size_mismatch, or else write.
func (m *metrics) countError(err error) {
	switch {
	case IsDiskFull(err):
		m.errors.WithLabelValues("disk_full").Inc()
	case errors.Is(err, ErrSizeMismatch):
		m.errors.WithLabelValues("size_mismatch").Inc()
	default:
		m.errors.WithLabelValues("write").Inc()
	}
}
