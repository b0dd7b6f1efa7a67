package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on every Linux this runs on).
const clockTicks = 100

// procCPU returns a process's user plus system CPU time so far, from /proc/<pid>/stat (fields 14 and 15).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu of %d: %w", pid, err)
	}

	// The command name (field 2) may hold spaces: count fields after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("cpu of %d: malformed stat", pid)
	}

	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu of %d: malformed stat", pid)
	}

	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)

	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cpu of %d: malformed stat", pid)
	}

	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// procRSS returns a process's resident set size in bytes (VmRSS of /proc/<pid>/status).
func procRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("rss of %d: %w", pid, err)
	}
	defer f.Close() //nolint:errcheck

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("rss of %d: %w", pid, err)
			}

			return kb << 10, nil
		}
	}

	return 0, fmt.Errorf("rss of %d: no VmRSS", pid)
}

// cpuSample is a process's CPU time at a moment.
type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

func sampleCPU(pid int) (cpuSample, error) {
	c, err := procCPU(pid)

	return cpuSample{at: time.Now(), cpu: c}, err
}

// cores is the CPU used between two samples divided by the wall time between them.
func cores(a, b cpuSample) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}

	return float64(b.cpu-a.cpu) / float64(wall)
}

// scrapeMetric returns the value of an unlabelled metric from a Prometheus text endpoint.
func scrapeMetric(ctx context.Context, url, name string) (float64, error) {
	series, err := scrapeAll(ctx, url)
	if err != nil {
		return 0, err
	}

	v, ok := series[name]
	if !ok {
		return 0, fmt.Errorf("metric %s not served", name)
	}

	return v, nil
}

// Dist summarises a sample: its size and percentiles.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// distOf summarises values (nearest-rank percentiles); an empty sample gives -1 for every percentile.
func distOf(values []float64) Dist {
	if len(values) == 0 {
		return Dist{P50: -1, P90: -1, P99: -1, Max: -1}
	}

	v := append([]float64(nil), values...)
	sort.Float64s(v)

	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(v)))) - 1

		return v[min(max(i, 0), len(v)-1)]
	}

	return Dist{N: len(v), P50: rank(0.5), P90: rank(0.9), P99: rank(0.99), Max: v[len(v)-1]}
}

// scrapeAll returns every sample of a Prometheus text endpoint by series: the name, then the labels in braces
// sorted by name (`name` or `name{a="x",b="y"}`), as in the exposition; histograms and summaries give their
// _bucket, _sum and _count (or quantile) series.
func scrapeAll(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close() //nolint:errcheck

	return parseSeries(resp.Body)
}

// parseSeries reads the Prometheus text exposition format into samples by series (see scrapeAll).
func parseSeries(r io.Reader) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)

	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}

	samples, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, slices.Collect(maps.Values(families))...)
	if err != nil {
		return nil, fmt.Errorf("read metric samples: %w", err)
	}

	out := make(map[string]float64, len(samples))

	for _, s := range samples {
		out[seriesKey(s.Metric)] = float64(s.Value)
	}

	return out, nil
}

// seriesKey is a series' name, then its other labels sorted by name in braces, values quoted (`name{a="x"}`).
func seriesKey(m model.Metric) string {
	names := make([]string, 0, len(m))

	for name := range m {
		if name != model.MetricNameLabel {
			names = append(names, string(name))
		}
	}

	key := string(m[model.MetricNameLabel])
	if len(names) == 0 {
		return key
	}

	sort.Strings(names)

	labels := make([]string, len(names))
	for i, name := range names {
		labels[i] = name + "=" + strconv.Quote(string(m[model.LabelName(name)]))
	}

	return key + "{" + strings.Join(labels, ",") + "}"
}

// writeSeriesRates writes, for every series that changed between two scrapes wall seconds apart, its change per
// second and both values, the fastest-changing first: what the controller did over the window (reconciles per
// controller, edge calls, Omni requests, bytes allocated).
func writeSeriesRates(w io.Writer, a, b map[string]float64, wall float64) error {
	type row struct {
		series         string
		rate, from, to float64
	}

	var rows []row

	for k, to := range b {
		if from := a[k]; to != from && wall > 0 {
			rows = append(rows, row{series: k, rate: (to - from) / wall, from: from, to: to})
		}
	}

	sort.Slice(rows, func(i, j int) bool {
		if math.Abs(rows[i].rate) != math.Abs(rows[j].rate) {
			return math.Abs(rows[i].rate) > math.Abs(rows[j].rate)
		}

		return rows[i].series < rows[j].series
	})

	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# per second over %.1f s, then the values at the window's start and end\n", wall) //nolint:errcheck // flushed below

	for _, r := range rows {
		fmt.Fprintf(bw, "%14.4f  %s  (%g -> %g)\n", r.rate, r.series, r.from, r.to) //nolint:errcheck // flushed below
	}

	return bw.Flush()
}
