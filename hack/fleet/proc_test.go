package fleet_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/hack/fleet"
)

func TestWriteSeriesRatesFastestFirst(t *testing.T) {
	t.Parallel()

	a := map[string]float64{`reconciles{controller="a"}`: 10, `reconciles{controller="b"}`: 100, "unchanged": 5, "gauge": 8}
	b := map[string]float64{`reconciles{controller="a"}`: 30, `reconciles{controller="b"}`: 400, "unchanged": 5, "gauge": 6, "new": 1}

	var out strings.Builder
	require.NoError(t, fleet.WriteSeriesRates(&out, a, b, 10))

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String()) // the heading and the four series that changed

	want := []string{`30.0000  reconciles{controller="b"}  (100 -> 400)`, `2.0000  reconciles{controller="a"}  (10 -> 30)`,
		`-0.2000  gauge  (8 -> 6)`, `0.1000  new  (0 -> 1)`}
	for i, w := range want {
		require.Equal(t, w, strings.TrimSpace(lines[i+1]))
	}
}

func TestParseSeriesReadsEveryServedSeries(t *testing.T) {
	t.Parallel()

	reg := prometheus.NewRegistry()

	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total", Help: "Calls."}, []string{"verb", "result"})
	calls.WithLabelValues("power_on", "ok").Add(3)
	calls.WithLabelValues(`say "hi"`, "error").Inc()

	pending := prometheus.NewGauge(prometheus.GaugeOpts{Name: "pending", Help: "Pending."})
	pending.Set(2.5)

	took := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "took_seconds", Help: "Took.", Buckets: []float64{0.1, 1}},
		[]string{"site"})
	took.WithLabelValues("a").Observe(0.5)
	took.WithLabelValues("a").Observe(2)

	reg.MustRegister(calls, pending, took)

	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))

	series, err := fleet.ParseSeries(rec.Body)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{
		`calls_total{result="ok",verb="power_on"}`:      3,
		`calls_total{result="error",verb="say \"hi\""}`: 1,
		"pending":                                 2.5,
		`took_seconds_bucket{le="0.1",site="a"}`:  0,
		`took_seconds_bucket{le="1",site="a"}`:    1,
		`took_seconds_bucket{le="+Inf",site="a"}`: 2,
		`took_seconds_sum{site="a"}`:              2.5,
		`took_seconds_count{site="a"}`:            2,
	}, series)
}

func TestParseSeriesRefusesWhatIsNotTheTextFormat(t *testing.T) {
	t.Parallel()

	_, err := fleet.ParseSeries(strings.NewReader("calls_total{verb=\"on\" 3\n"))
	require.Error(t, err)
}
