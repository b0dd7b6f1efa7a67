package app

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSiteHealth(t *testing.T) {
	t.Parallel()

	sites := []string{"branch-1", "branch-2", "branch-3"}
	up := map[string]bool{"branch-1": true, "branch-2": true, "branch-3": true}

	health := siteHealth(func(context.Context) ([]string, error) { return sites, nil }, func(s string) bool { return up[s] })

	require.NoError(t, health(t.Context()), "all connected: healthy")

	up["branch-2"] = false
	require.EqualError(t, health(t.Context()), "2 of 3 sites connected; offline: branch-2")

	// 500 sites, 300 offline: the message names what fits and counts the rest
	sites, up = nil, map[string]bool{}

	for i := range 500 {
		s := fmt.Sprintf("site-%03d", i)
		sites = append(sites, s)
		up[s] = i >= 300
	}

	err := health(t.Context())
	require.Error(t, err)
	require.LessOrEqual(t, len(err.Error()), maxHealthMessage)
	require.Contains(t, err.Error(), "200 of 500 sites connected; offline: site-000, site-001")
	require.Regexp(t, `\(\+\d+ more\)$`, err.Error())
}
