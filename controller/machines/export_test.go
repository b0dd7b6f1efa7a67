package machines

import "github.com/prometheus/client_golang/prometheus/testutil"

// Rejected returns how many events were dropped for reason ("machine_moved" counts moves).
func (l *Locations) Rejected(reason string) float64 {
	return testutil.ToFloat64(l.rejected.WithLabelValues(reason))
}
