package sites_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

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

// The server's health lists the registered sites without a live session.
func TestServerHealth(t *testing.T) {
	t.Parallel()

	reg := newRegistry(t, time.Now)

	for _, id := range []string{"branch-1", "branch-2"} {
		_, _, err := reg.Create(t.Context(), id, "", sites.TokenOptions{TTL: time.Hour})
		require.NoError(t, err)
	}

	ca, _, _, err := sites.NewCA(time.Now())
	require.NoError(t, err)

	srv, err := sites.NewServer(sites.Options{
		Logger: zaptest.NewLogger(t), Registry: reg, CA: ca, Statuses: state.WrapCore(namespaced.NewState(inmem.Build)),
	})
	require.NoError(t, err)

	require.EqualError(t, srv.Health(t.Context()), "0 of 2 sites connected; offline: branch-1, branch-2")
}
