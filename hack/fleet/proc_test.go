package fleet_test

import (
	"strings"
	"testing"

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
