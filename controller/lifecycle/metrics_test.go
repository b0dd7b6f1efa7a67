package lifecycle_test

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The lifecycle's metrics tell how long reconciles took per controller and how edge calls went, by outcome:
// an offline site's calls are counted apart from the ones that worked.
func TestMetricsTimeReconcilesAndEdgeCalls(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(h.stats))

	h.ready("m1", "site-a")

	require.Positive(t, sampleCount(t, reg, "outpost_lifecycle_reconcile_duration_seconds", map[string]string{"controller": "lifecycle.PowerController"}))
	require.Positive(t, sampleCount(t, reg, "outpost_lifecycle_edge_call_duration_seconds", map[string]string{"call": "power_off", "outcome": "ok"}))
	require.Zero(t, sampleCount(t, reg, "outpost_lifecycle_edge_call_duration_seconds", map[string]string{"call": "power_status", "outcome": "site_offline"}))

	h.edge.SetOffline("site-a", true)
	h.eventually("an offline site's call counted as such", func() bool {
		return sampleCount(t, reg, "outpost_lifecycle_edge_call_duration_seconds", map[string]string{"call": "power_status", "outcome": "site_offline"}) > 0
	})
}

// sampleCount is how many observations the histogram name holds with exactly these labels (0: none yet).
func sampleCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()

	families, err := reg.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() != name {
			continue
		}

		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}

			if maps.Equal(got, labels) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}

	return 0
}
