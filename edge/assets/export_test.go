package assets

import "github.com/prometheus/client_golang/prometheus/testutil"

// ErrorCount returns how many errors with this reason the store counted.
func (s *Store) ErrorCount(reason string) float64 {
	return testutil.ToFloat64(s.metrics.errors.WithLabelValues(reason))
}
