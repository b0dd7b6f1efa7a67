package sites_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/sites"
)

// FollowSettings hands over every site's settings at once, then each change, and the zero settings for a
// deleted site; a refused change (the check) stores nothing and is not handed over.
func TestFollowSettings(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	reg := newRegistry(t, time.Now)

	_, _, err := reg.Create(ctx, "branch-1", "", sites.TokenOptions{})
	require.NoError(t, err)

	accept := func(string, sites.Settings) error { return nil }
	_, err = reg.SetSettings(ctx, "branch-1", accept, func(s *sites.Settings) error { s.Discovery = "known"; return nil })
	require.NoError(t, err)

	var (
		mu   sync.Mutex
		seen = map[string]sites.Settings{}
	)

	latest := func(id string) (sites.Settings, bool) {
		mu.Lock()
		defer mu.Unlock()

		s, ok := seen[id]

		return s, ok
	}

	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})

	go func() {
		defer close(done)
		reg.FollowSettings(fctx, zaptest.NewLogger(t), func(id string, s sites.Settings) {
			mu.Lock()
			defer mu.Unlock()

			seen[id] = s
		})
	}()

	t.Cleanup(func() { cancel(); <-done })

	require.Eventually(t, func() bool { s, _ := latest("branch-1"); return s.Discovery == "known" }, 5*time.Second, 5*time.Millisecond,
		"the settings stored before the watch began")

	_, err = reg.SetSettings(ctx, "branch-1", accept, func(s *sites.Settings) error { s.WipeMethod = "zeroes"; return nil })
	require.NoError(t, err)
	require.Eventually(t, func() bool { s, _ := latest("branch-1"); return s.WipeMethod == "zeroes" && s.Discovery == "known" },
		5*time.Second, 5*time.Millisecond, "a change")

	// the labels published on the site's machines come with its settings (the lifecycle reads them from memory)
	require.NoError(t, reg.SetLabels(ctx, "branch-1", map[string]string{"rack": "2"}))
	require.Eventually(t, func() bool { s, _ := latest("branch-1"); return s.Labels["rack"] == "2" && s.WipeMethod == "zeroes" },
		5*time.Second, 5*time.Millisecond, "a change of labels")

	refuse := func(string, sites.Settings) error { return errors.New("no") }
	_, err = reg.SetSettings(ctx, "branch-1", refuse, func(s *sites.Settings) error { s.WipeMethod = "fast"; return nil })
	require.Error(t, err)

	got, err := reg.Get(ctx, "branch-1")
	require.NoError(t, err)
	require.Equal(t, "zeroes", sites.SettingsOf(got).WipeMethod, "a refused change stores nothing")

	require.NoError(t, reg.Delete(ctx, "branch-1"))
	require.Eventually(t, func() bool { s, _ := latest("branch-1"); return s.Discovery == "" && s.WipeMethod == "" }, 5*time.Second,
		5*time.Millisecond, "a deleted site's settings are the zero ones")
}
