package app_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/shared/nettest"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// edgeConfig is an edge on loopback with a controller that is not there (it keeps trying to enrol in the
// background and serves the site meanwhile).
func edgeConfig(t *testing.T) config.Config {
	t.Helper()

	ipxeDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ipxeDir, "ipxe.efi"), []byte("efi"), 0o644))

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.IPXEDir = ipxeDir
	cfg.HTTP.Listen = freeAddr(t, "tcp")
	cfg.APIListen = freeAddr(t, "tcp")
	cfg.TFTP.Listen = freeAddr(t, "udp")
	cfg.Uplink.ControllerAddress = nettest.RefusingAddr(t)
	cfg.Uplink.JoinToken = uplink.JoinToken{SiteID: "lab", Secret: make([]byte, uplink.SecretLen)}.String()

	return cfg
}

// free reports whether addr can be listened on again (the edge closed it).
func free(t *testing.T, network, addr string) bool {
	t.Helper()

	if network == "udp" {
		c, err := net.ListenPacket("udp4", addr)
		if err == nil {
			c.Close()
		}

		return err == nil
	}

	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
	}

	return err == nil
}

func healthy(t *testing.T, addr string) bool {
	t.Helper()

	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}

	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}

	resp.Body.Close()

	return resp.StatusCode == http.StatusOK
}

// registryServed checks that the edge's HTTP server answers the OCI registry's base endpoint and counts its
// requests in /metrics.
func registryServed(t *testing.T, addr string) {
	t.Helper()

	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

	resp, err := c.Get("http://" + addr + "/v2/")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "registry/2.0", resp.Header.Get("Docker-Distribution-API-Version"))

	resp, err = c.Get("http://" + addr + "/metrics")
	require.NoError(t, err)

	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Contains(t, string(body), `outpost_edge_registry_requests_total{outcome="served",route="base"} 1`)
}

// A construction step that fails after others were built names its component, leaves no goroutine and
// closes what was opened before it.
func TestBuildFailureNamesTheComponent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, cfg *config.Config)
		want    string
	}{
		{"agent API port taken", func(t *testing.T, cfg *config.Config) {
			ln, err := net.Listen("tcp", cfg.APIListen)
			require.NoError(t, err)
			t.Cleanup(func() { ln.Close() })
		}, "agent API listener"},
		{"TFTP port taken", func(t *testing.T, cfg *config.Config) {
			c, err := net.ListenPacket("udp4", cfg.TFTP.Listen)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
		}, "tftp listener"},
		{"no iPXE binaries", func(t *testing.T, cfg *config.Config) { cfg.IPXEDir = filepath.Join(t.TempDir(), "none") }, "iPXE binaries"},
		{"state directory is a file", func(t *testing.T, cfg *config.Config) {
			f := filepath.Join(t.TempDir(), "file")
			require.NoError(t, os.WriteFile(f, nil, 0o644))
			cfg.StateDir = f
		}, "boot table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

			cfg := edgeConfig(t)
			tc.breakIt(t, &cfg)

			edge, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), app.Options{})
			require.Nil(t, edge)
			require.ErrorContains(t, err, tc.want)

			if tc.want != "agent API listener" && tc.want != "tftp listener" {
				return
			}

			// What was opened before the failing step is closed: the HTTP port is free again.
			require.True(t, free(t, "tcp", cfg.HTTP.Listen), "http listener left open")
		})
	}
}

// Cancelling the edge stops every component; everything Build opened is closed.
func TestCancellationStopsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	cfg := edgeConfig(t)

	edge, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), app.Options{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)

	go func() { ran <- edge.Run(ctx) }()

	require.Eventually(t, func() bool { return healthy(t, cfg.HTTP.Listen) }, 30*time.Second, 10*time.Millisecond)
	registryServed(t, cfg.HTTP.Listen)

	cancel()
	require.NoError(t, <-ran)

	for network, addr := range map[string]string{"tcp": cfg.HTTP.Listen, "udp": cfg.TFTP.Listen} {
		require.True(t, free(t, network, addr), "%s %s left open", network, addr)
	}

	require.True(t, free(t, "tcp", cfg.APIListen), "agent API left open")
	require.Error(t, edge.Run(context.Background()), "an edge runs once")
}

// One component ending stops the others: the lab's controller API listener closed under the running edge
// ends its component, and the whole edge with it, the error naming the component.
func TestOneComponentEndingStopsTheEdge(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	cfg := edgeConfig(t)

	api, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	edge, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), app.Options{ControllerAPI: api})
	require.NoError(t, err)

	ran := make(chan error, 1)

	go func() { ran <- edge.Run(context.Background()) }()

	require.Eventually(t, func() bool { return healthy(t, cfg.HTTP.Listen) }, 30*time.Second, 10*time.Millisecond)

	require.NoError(t, api.Close())

	select {
	case err := <-ran:
		require.ErrorContains(t, err, "controller API")
	case <-time.After(30 * time.Second):
		t.Fatal("the edge went on without its controller API")
	}

	require.True(t, free(t, "tcp", cfg.HTTP.Listen), "http listener left open")
}

// A Built edge that is never run gives its sockets back on Close.
func TestCloseWithoutRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	cfg := edgeConfig(t)

	edge, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), app.Options{})
	require.NoError(t, err)
	require.False(t, free(t, "tcp", cfg.HTTP.Listen), "Build opens the listeners")
	require.NoError(t, edge.Close())
	require.True(t, free(t, "tcp", cfg.HTTP.Listen))
}
