package app_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/status"
)

// runBuilt runs a built controller until the returned stop is called (deferred after goleak's check, so it
// runs first).
func runBuilt(t *testing.T, c *app.Controller) (stop func()) {
	t.Helper()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- c.Run(ctx) }()

	require.Eventually(t, func() bool { return !refused(c.HTTPAddr()) }, 5*time.Second, 10*time.Millisecond)

	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}

func fetch(t *testing.T, client *http.Client, url, token string) (int, string) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)

	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}

	resp, err := client.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return resp.StatusCode, string(b)
}

// On loopback the status pages are served as they are, and the Machines API answers on the admin socket.
func TestStatusOnLoopback(t *testing.T) {
	defer goleak.VerifyNone(t)

	cfg := testConfig(t)

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	defer runBuilt(t, c)()

	code, body := fetch(t, http.DefaultClient, "http://"+c.HTTPAddr().String()+"/status/", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "<h2>Sites</h2>")

	cli, err := admincli.Dial(cfg.AdminSocketPath())
	require.NoError(t, err)

	defer cli.Close() //nolint:errcheck // before the controller stops

	var out bytes.Buffer

	require.NoError(t, cli.ListMachines(t.Context(), admincli.MachineFilter{}, &out, time.Now()))
	require.Contains(t, out.String(), "MACHINE")

	http.DefaultClient.CloseIdleConnections()
}

// Off loopback the controller does not start without a token and TLS.
func TestStatusOffLoopbackNeedsTokenAndTLS(t *testing.T) {
	defer goleak.VerifyNone(t)

	cfg := testConfig(t)
	cfg.HTTPListen = "0.0.0.0:0"

	_, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.ErrorIs(t, err, status.ErrOffLoopback)
}

// With a token and TLS, a request without the token is refused with 401, one with it is served, and the
// health check needs none.
func TestStatusTokenAndTLS(t *testing.T) {
	defer goleak.VerifyNone(t)

	cfg := testConfig(t)
	dir := t.TempDir()
	cfg.HTTPCertFile, cfg.HTTPKeyFile = selfSigned(t, dir)
	cfg.HTTPTokenFile = filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(cfg.HTTPTokenFile, []byte("correct-horse-battery-staple\n"), 0o600))

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	defer runBuilt(t, c)()

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // a test's own certificate
	defer client.CloseIdleConnections()

	base := "https://" + c.HTTPAddr().String()

	code, _ := fetch(t, client, base+"/status/", "")
	require.Equal(t, http.StatusUnauthorized, code)

	code, _ = fetch(t, client, base+"/metrics", "wrong-token-wrong-token")
	require.Equal(t, http.StatusUnauthorized, code)

	code, body := fetch(t, client, base+"/status/", "correct-horse-battery-staple")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "<h2>Sites</h2>")

	code, body = fetch(t, client, base+"/metrics", "correct-horse-battery-staple")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "outpost_http_unauthorized_requests_total 2")

	code, body = fetch(t, client, base+"/healthz", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	code, _ = fetch(t, client, base+"/readyz", "")
	require.NotEqual(t, http.StatusUnauthorized, code, "readiness probes need no token")
}

func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()

	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	require.NoError(t, err)

	keyDER, err := x509.MarshalECPrivateKey(priv)
	require.NoError(t, err)

	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))

	return cert, key
}
