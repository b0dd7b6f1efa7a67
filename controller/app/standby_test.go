package app_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/lease"
	qomni "github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// startStandIn serves the Omni stand-in on loopback until the test ends.
func startStandIn(t *testing.T) (*qomni.Server, string) {
	t.Helper()

	cfg := qomni.Default()
	cfg.Logger = zaptest.NewLogger(t).Named("omni")

	srv, err := qomni.New(cfg)
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		<-done
	})

	return srv, "grpc://" + ln.Addr().String()
}

// omniConfig is a controller of the stand-in's provider with its own state directory and ports, and a short
// lease.
func omniConfig(t *testing.T, srv *qomni.Server, endpoint string) config.Config {
	t.Helper()

	cfg := testConfig(t)
	cfg.Omni.Endpoint = endpoint
	cfg.Omni.ServiceAccountKey = srv.ProviderKey()
	cfg.Omni.RetryMin, cfg.Omni.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	cfg.Omni.HealthInterval = 100 * time.Millisecond
	cfg.ImageFactoryURL = "https://factory.invalid"
	cfg.Lease = lease.Config{Duration: time.Second, Renew: 150 * time.Millisecond, Margin: 300 * time.Millisecond}

	return cfg
}

type running struct {
	c      *app.Controller
	cfg    config.Config
	cancel context.CancelFunc
	done   chan error
}

func runController(t *testing.T, cfg config.Config, name string) *running {
	t.Helper()

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t).Named(name))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	r := &running{c: c, cfg: cfg, cancel: cancel, done: make(chan error, 1)}

	go func() { r.done <- c.Run(ctx) }()

	t.Cleanup(r.stop)

	return r
}

func (r *running) stop() {
	if r.cancel == nil {
		return
	}

	r.cancel()
	<-r.done
	r.cancel = nil
}

func ready(addr net.Addr) int {
	resp, err := http.Get("http://" + addr.String() + "/readyz")
	if err != nil {
		return 0
	}

	defer resp.Body.Close() //nolint:errcheck

	return resp.StatusCode
}

// createSite creates a site through the controller's admin socket and returns its join token.
func createSite(t *testing.T, cfg config.Config, site string) uplink.JoinToken {
	t.Helper()

	cli, err := admincli.Dial(cfg.AdminSocketPath())
	require.NoError(t, err)

	defer cli.Close() //nolint:errcheck

	var out, info bytes.Buffer

	require.NoError(t, cli.CreateSite(t.Context(), site, "", admincli.TokenOptions{TTL: time.Hour}, &out, &info))

	tok, err := uplink.ParseJoinToken(strings.TrimSpace(out.String()))
	require.NoError(t, err)

	return tok
}

func listSites(t *testing.T, cfg config.Config) string {
	t.Helper()

	cli, err := admincli.Dial(cfg.AdminSocketPath())
	require.NoError(t, err)

	defer cli.Close() //nolint:errcheck

	var out bytes.Buffer

	require.NoError(t, cli.ListSites(t.Context(), &out, time.Now()))

	return out.String()
}

// Two controllers of one provider against one Omni, each with a state directory of its own: one acts (ready,
// uplink listening), the other stands by (not ready, uplink refused) yet has the same sites and the same CA,
// since both live in Omni; when the active one stops, the standby acts.
func TestStandbyTakesOver(t *testing.T) {
	srv, endpoint := startStandIn(t)

	a := runController(t, omniConfig(t, srv, endpoint), "a")
	require.Eventually(t, func() bool { return ready(a.c.HTTPAddr()) == http.StatusOK }, 10*time.Second, 20*time.Millisecond)

	tokA := createSite(t, a.cfg, "branch-1")

	b := runController(t, omniConfig(t, srv, endpoint), "b")
	require.Never(t, func() bool { return ready(b.c.HTTPAddr()) != http.StatusServiceUnavailable }, 3*time.Second, 50*time.Millisecond,
		"the second controller stands by while the first renews")
	require.True(t, refused(b.c.UplinkAddr()), "a standby does not listen for edges")
	require.False(t, refused(a.c.UplinkAddr()))

	// The standby reads the same sites and signs with the same CA: a token it makes pins the same fingerprint.
	// It names where the acting one accepts edges: the port its listen address resolved to, from the lease.
	sitesAtB := listSites(t, b.cfg)
	require.Contains(t, sitesAtB, "branch-1")
	require.Contains(t, sitesAtB, "(uplink "+a.c.UplinkAddr().String()+")")

	tokB := createSite(t, b.cfg, "branch-2")
	require.Equal(t, tokA.CAFingerprint, tokB.CAFingerprint)

	// The active controller stops: the standby acts well within the lease duration (it was given up).
	stopped := time.Now()

	a.stop()
	require.Eventually(t, func() bool { return ready(b.c.HTTPAddr()) == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return !refused(b.c.UplinkAddr()) }, 5*time.Second, 20*time.Millisecond)
	t.Logf("the standby acted %s after the active controller stopped", time.Since(stopped))
	require.Contains(t, listSites(t, b.cfg), "branch-2")
}
