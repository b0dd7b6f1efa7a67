package sites_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/sites"
)

func TestHealthOf(t *testing.T) {
	t.Parallel()

	names := []string{"branch-1", "branch-2", "branch-3"}
	up := map[string]bool{"branch-1": true, "branch-2": true, "branch-3": true}
	online := func(s string) bool { return up[s] }

	require.NoError(t, sites.HealthOf(names, online), "all connected: healthy")

	up["branch-2"] = false
	require.EqualError(t, sites.HealthOf(names, online), "2 of 3 sites connected; offline: branch-2")

	// 500 sites, 300 offline: the message names what fits and counts the rest
	names, up = nil, map[string]bool{}

	for i := range 500 {
		s := fmt.Sprintf("site-%03d", i)
		names = append(names, s)
		up[s] = i >= 300
	}

	err := sites.HealthOf(names, online)
	require.Error(t, err)
	require.LessOrEqual(t, len(err.Error()), sites.MaxHealthMessage)
	require.Contains(t, err.Error(), "200 of 500 sites connected; offline: site-000, site-001")
	require.Regexp(t, `\(\+\d+ more\)$`, err.Error())
}

func TestRegistrySiteLabels(t *testing.T) {
	t.Parallel()

	reg := newRegistry(t, time.Now)

	_, _, err := reg.Create(t.Context(), "branch-1", "", sites.TokenOptions{TTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, reg.SetLabels(t.Context(), "branch-1", map[string]string{"rack": "2"}))

	require.Equal(t, map[string]string{"rack": "2"}, reg.SiteLabels("branch-1"))
	require.Nil(t, reg.SiteLabels("unknown"))
}
