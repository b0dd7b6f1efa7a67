package assets

import "github.com/prometheus/client_golang/prometheus/testutil"

// ErrorCount returns how many errors with this reason the store counted.
func (s *Store) ErrorCount(reason string) float64 {
	return testutil.ToFloat64(s.metrics.errors.WithLabelValues(reason))
}

// TalosName is the logical name of a Talos install boot asset for a version, image factory schematic and
// architecture, as the controller names them.
func TalosName(version, schematic, arch, kind string) string {
	return "talos/" + version + "/" + schematic + "/" + arch + "/" + kind
}
