// Package metricnames_test checks every Prometheus metric the controller and the edge define: Prometheus's naming
// conventions (the outpost_ prefix, snake case, _total on counters and only there, a base unit at the end of
// histograms and summaries) and a row in the README's metrics table for each.
package metricnames_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type metric struct {
	name, kind, help, at string
}

var optsKinds = map[string]string{
	"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram", "SummaryOpts": "summary",
}

// defined parses the product's Go files (tests left out) for prometheus.<Kind>Opts literals and returns the
// metrics whose name is written out there, and the places where it is not (a name built at run time).
func defined(t *testing.T) ([]metric, []string) {
	t.Helper()

	var (
		out     []metric
		dynamic []string
		fset    = token.NewFileSet()
	)

	for _, root := range []string{"controller", "edge", "shared"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}

			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}

			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}

				sel, ok := lit.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}

				kind, ok := optsKinds[sel.Sel.Name]
				if x, isIdent := sel.X.(*ast.Ident); !ok || !isIdent || x.Name != "prometheus" {
					return true
				}

				parts := map[string]string{}
				literal := true

				for _, e := range lit.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}

					key, _ := kv.Key.(*ast.Ident)
					if key == nil || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name" && key.Name != "Help") {
						continue
					}

					bl, ok := kv.Value.(*ast.BasicLit)
					if !ok || bl.Kind != token.STRING {
						literal = literal && key.Name == "Help"

						continue
					}

					parts[key.Name], _ = strconv.Unquote(bl.Value)
				}

				at := fset.Position(lit.Pos()).String()
				if !literal || parts["Name"] == "" {
					dynamic = append(dynamic, at)

					return true
				}

				var name []string
				for _, k := range []string{"Namespace", "Subsystem", "Name"} {
					if parts[k] != "" {
						name = append(name, parts[k])
					}
				}

				out = append(out, metric{name: strings.Join(name, "_"), kind: kind, help: parts["Help"], at: at})

				return true
			})

			return nil
		})
		require.NoError(t, err)
	}

	return out, dynamic
}

var snake = regexp.MustCompile(`^outpost_[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func TestMetricNamesFollowPrometheusConventions(t *testing.T) {
	metrics, dynamic := defined(t)
	require.Greater(t, len(metrics), 30, "the parser found the metrics")

	for _, at := range dynamic {
		t.Logf("name not written out, not checked here: %s", at)
	}

	for _, m := range metrics {
		require.Regexp(t, snake, m.name, "%s: prefix outpost_ and snake case", m.at)

		switch m.kind {
		case "counter":
			require.True(t, strings.HasSuffix(m.name, "_total"), "%s: counter %s ends in _total", m.at, m.name)
		case "histogram", "summary":
			require.True(t, strings.HasSuffix(m.name, "_seconds") || strings.HasSuffix(m.name, "_bytes"),
				"%s: %s %s ends in its base unit (_seconds, _bytes)", m.at, m.kind, m.name)
		default:
			require.False(t, strings.HasSuffix(m.name, "_total"), "%s: %s %s is not a counter", m.at, m.kind, m.name)
		}
	}
}

func TestReadmeListsEveryMetric(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)

	metrics, _ := defined(t)

	var missing []string

	if os.Getenv("METRICS_TABLE") != "" {
		for _, m := range metrics {
			t.Logf("TABLE | `%s` | %s | %s | %s |", m.name, m.kind, m.help, m.at)
		}
	}

	for _, m := range metrics {
		named := strings.Contains(string(readme), "`"+m.name+"`") || strings.Contains(string(readme), "`"+m.name+"{")
		if !named && !slices.Contains(missing, m.name) {
			missing = append(missing, m.name)
			t.Logf("| `%s` | %s | %s |", m.name, m.kind, m.help)
		}
	}

	slices.Sort(missing)
	require.Empty(t, missing, "metrics the README's metrics section does not name")
}
