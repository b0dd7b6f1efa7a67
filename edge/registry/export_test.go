package registry

import "github.com/prometheus/client_golang/prometheus/testutil"

// Target is a parsed request path with its route spelt out: "base", "manifest", "blob" or "tags".
type Target struct {
	Route, Repo, Tag, Hex string
}

// ParsePath parses the escaped path of a request as the handler does.
func ParsePath(path string) (Target, error) {
	t, err := parsePath(path)
	if err != nil {
		return Target{}, err
	}

	return Target{Route: routeLabel(t.route), Repo: t.repo, Tag: t.tag, Hex: t.hex}, nil
}

// Requests returns how many requests of a route had an outcome.
func (h *Handler) Requests(route, outcome string) float64 {
	return testutil.ToFloat64(h.metrics.requests.WithLabelValues(route, outcome))
}
