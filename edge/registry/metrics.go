package registry

import "github.com/prometheus/client_golang/prometheus"

// Request routes and outcomes, the labels of outpost_edge_registry_requests_total.
const (
	labelBase     = "base"
	labelManifest = "manifest"
	labelBlob     = "blob"
	labelTags     = "tags"
	labelOther    = "other"

	outcomeServed      = "served"      // answered from the cache (also 206 and 304)
	outcomeUnknown     = "unknown"     // not held for that repository
	outcomeInvalid     = "invalid"     // a malformed name, reference, digest or path
	outcomeUnsupported = "unsupported" // a write or a path the pull API does not have
	outcomeRefused     = "refused"     // held, but not served: not a manifest, too large, not accepted by the client
	outcomeCorrupt     = "corrupt"     // the cache's content does not match its digest or name
	outcomeBusy        = "busy"        // too many tag listings at once
	outcomeError       = "error"       // the cache failed
)

// metrics are the registry's counters.
type metrics struct {
	requests *prometheus.CounterVec
}

func newMetrics() metrics {
	return metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_registry_requests_total",
			Help: "Requests to the edge's OCI registry (/v2/), by route (base, manifest, blob, tags, other) and outcome (served, unknown, invalid, unsupported, refused, corrupt, busy, error).",
		}, []string{"route", "outcome"}),
	}
}

// Collectors returns the registry's prometheus collectors for the caller to register.
func (h *Handler) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.metrics.requests}
}
