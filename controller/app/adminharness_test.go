package app_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/config"
)

// runWithAdmin builds and runs a controller from cfg until the test ends, and returns a context that ends
// with the test and a client of its admin socket once it answers.
func runWithAdmin(t *testing.T, cfg config.Config) (context.Context, *admincli.Client) {
	t.Helper()

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- c.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	var admin *admincli.Client

	require.Eventually(t, func() bool {
		admin, err = admincli.Dial(cfg.AdminSocketPath())
		if err != nil {
			return false
		}

		if err = admin.ListSites(ctx, io.Discard, time.Now()); err != nil {
			admin.Close() //nolint:errcheck

			return false
		}

		return true
	}, 10*time.Second, 20*time.Millisecond, "admin socket: %v", err)

	t.Cleanup(func() { admin.Close() }) //nolint:errcheck

	return ctx, admin
}
