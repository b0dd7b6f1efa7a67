package app_test

// These tests start goroutines and check with goleak that none is left, so they do not run in parallel.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/go-api-signature/pkg/pgp"
	"github.com/siderolabs/go-api-signature/pkg/serviceaccount"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/shared/rungroup"
)

// testConfig is a controller on loopback ports chosen by the kernel, with its state in a new directory.
func testConfig(t *testing.T) config.Config {
	t.Helper()

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.UplinkListen = "127.0.0.1:0"
	cfg.HTTPListen = "127.0.0.1:0"

	return cfg
}

func serviceAccountKey(t *testing.T) string {
	t.Helper()

	const name = "bare-metal@infra-provider.serviceaccount.omni.sidero.dev"

	key, err := pgp.GenerateKey("bare-metal", "", name, time.Hour)
	require.NoError(t, err)

	enc, err := serviceaccount.Encode(name, key)
	require.NoError(t, err)

	return enc
}

// refused reports whether nothing accepts connections at addr any more.
func refused(addr net.Addr) bool {
	c, err := net.DialTimeout(addr.Network(), addr.String(), time.Second)
	if err == nil {
		c.Close() //nolint:errcheck

		return false
	}

	return true
}

func healthz(t *testing.T, addr net.Addr) string {
	t.Helper()

	resp, err := http.Get("http://" + addr.String() + "/healthz")
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return string(b)
}

// A step failing after others were built returns an error naming the step, leaves no goroutine and no port
// behind, and closes the store: the same state directory builds again at once (the bolt file is locked while
// open, and its open gives up after five seconds).
func TestBuildFailureClosesWhatWasBuilt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, cfg *config.Config)
		want   string
	}{
		{
			name: "http port taken, after everything else",
			change: func(t *testing.T, cfg *config.Config) {
				t.Helper()

				taken, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				t.Cleanup(func() { taken.Close() }) //nolint:errcheck

				cfg.HTTPListen = taken.Addr().String()
			},
			want: "build listeners: http: listen tcp",
		},
		{
			name: "trusted roots missing, before Omni is asked anything",
			change: func(t *testing.T, cfg *config.Config) {
				t.Helper()

				cfg.Omni.Endpoint = "grpc://127.0.0.1:1"
				cfg.Omni.ServiceAccountKey = serviceAccountKey(t)
				cfg.ImageFactoryURL = "https://factory.invalid"
				cfg.TrustedRootsFile = filepath.Join(t.TempDir(), "missing.pem")
			},
			want: "build configuration: trusted roots:",
		},
		{
			name: "no agent images, in the site assets",
			change: func(t *testing.T, cfg *config.Config) {
				t.Helper()

				cfg.AgentAssetsDir = t.TempDir()
			},
			want: "build site assets: agent assets: no <arch>/vmlinuz",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t)

			cfg := testConfig(t)
			tc.change(t, &cfg)

			c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, c)

			good := testConfig(t)
			good.StateDir = cfg.StateDir

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()

			c, err = app.Build(ctx, good, zaptest.NewLogger(t))
			require.NoError(t, err, "the store and the admin socket were released")

			cancel()
			require.NoError(t, c.Run(ctx))
		})
	}
}

// One component returning nil before the controller is told to stop ends the run: the others stop, Run
// returns an error naming the component, and the ports are closed.
func TestComponentEndingStopsAll(t *testing.T) {
	defer goleak.VerifyNone(t)

	c, err := app.Build(t.Context(), testConfig(t), zaptest.NewLogger(t))
	require.NoError(t, err)

	release := make(chan struct{})

	c.AddComponent("quitter", func(context.Context) error {
		<-release

		return nil
	})

	done := make(chan error, 1)

	go func() { done <- c.Run(t.Context()) }()

	require.Eventually(t, func() bool { return !refused(c.HTTPAddr()) }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "ok\n", healthz(t, c.HTTPAddr()))

	close(release)

	select {
	case err := <-done:
		require.ErrorIs(t, err, rungroup.ErrStoppedOnItsOwn)
		require.EqualError(t, err, "quitter: stopped on its own")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after a component ended")
	}

	require.True(t, refused(c.UplinkAddr()), "uplink closed")
	require.True(t, refused(c.HTTPAddr()), "http closed")

	require.ErrorIs(t, c.Run(t.Context()), rungroup.ErrAlreadyRun, "a controller runs once")
}

// A component's error stops the others too, and Run returns it with the component's name.
func TestComponentErrorStopsAll(t *testing.T) {
	defer goleak.VerifyNone(t)

	c, err := app.Build(t.Context(), testConfig(t), zaptest.NewLogger(t))
	require.NoError(t, err)

	boom := errors.New("boom")

	c.AddComponent("failing", func(context.Context) error { return boom })

	err = c.Run(t.Context())
	require.ErrorIs(t, err, boom)
	require.EqualError(t, err, "failing: boom")
	require.True(t, refused(c.UplinkAddr()))
}

// Cancelling the context stops every component; what Build opened is closed only after all of them returned,
// and Run returns nil. Meanwhile the controller serves: /healthz over HTTP, the admin API on its socket.
func TestCancelStopsAllThenCloses(t *testing.T) {
	defer goleak.VerifyNone(t)

	cfg := testConfig(t)

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	var slowReturned, closerRan, closedAfter, uplinkClosed atomic.Bool

	letGo := make(chan struct{})

	// slow keeps running after the cancellation until the test lets it go, as a server draining its
	// connections does.
	c.AddComponent("slow", func(ctx context.Context) error {
		<-ctx.Done()
		<-letGo
		slowReturned.Store(true)

		return nil
	})

	c.AddCloser("probe", func() error {
		closerRan.Store(true)
		closedAfter.Store(slowReturned.Load())
		uplinkClosed.Store(refused(c.UplinkAddr()))

		return nil
	})

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- c.Run(ctx) }()

	require.Eventually(t, func() bool { return !refused(c.HTTPAddr()) }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "ok\n", healthz(t, c.HTTPAddr()))

	admin, err := admincli.Dial(cfg.AdminSocketPath())
	require.NoError(t, err)

	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	require.NoError(t, admin.ListSites(actx, io.Discard, time.Now()), "the admin API answers")
	acancel()
	require.NoError(t, admin.Close())

	cancel()

	require.Eventually(t, func() bool { return refused(c.HTTPAddr()) }, 10*time.Second, 10*time.Millisecond)
	require.False(t, closerRan.Load(), "nothing is closed while a component runs")
	close(letGo)

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancellation")
	}

	require.True(t, closedAfter.Load(), "closed only after every component returned")
	require.True(t, uplinkClosed.Load(), "the uplink server had stopped before the closes")
	require.True(t, refused(c.HTTPAddr()))
	require.NoFileExists(t, cfg.AdminSocketPath(), "the admin socket is removed")
}

// A controller built and closed without a run gives back what Build took: its ports, the admin socket and the
// store (the same state directory builds again at once; the bolt file stays locked while open), and no
// goroutine is left. It cannot run after.
func TestCloseWithoutRun(t *testing.T) {
	defer goleak.VerifyNone(t)

	cfg := testConfig(t)

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.False(t, refused(c.UplinkAddr()), "Build opens the uplink listener")
	require.FileExists(t, cfg.AdminSocketPath())

	var closed atomic.Int32

	c.AddCloser("probe", func() error { closed.Add(1); return nil })

	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "a second Close does nothing")
	require.Equal(t, int32(1), closed.Load(), "closed once")
	require.True(t, refused(c.UplinkAddr()), "uplink closed")
	require.True(t, refused(c.HTTPAddr()), "http closed")
	require.NoFileExists(t, cfg.AdminSocketPath(), "the admin socket is removed")
	require.ErrorIs(t, c.Run(t.Context()), rungroup.ErrAlreadyRun)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()

	again, err := app.Build(ctx, cfg, zaptest.NewLogger(t))
	require.NoError(t, err, "the store was released")
	require.NoError(t, again.Close())
}
