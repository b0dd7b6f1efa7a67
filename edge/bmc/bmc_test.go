package bmc_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/bmc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var creds = bmc.Credentials{Username: "operator", Password: "hunter2-hunter2"}

func manager(t *testing.T) *bmc.Manager {
	t.Helper()

	cfg := bmc.Default()
	cfg.CallTimeout = 1500 * time.Millisecond
	cfg.ProbeTimeout = 500 * time.Millisecond
	cfg.IPMIExchangeTimeout = 200 * time.Millisecond
	cfg.RatePerSecond, cfg.Burst = 100, 10

	m, err := bmc.New(cfg, zaptest.NewLogger(t), nil)
	require.NoError(t, err)
	t.Cleanup(m.Close)

	return m
}

// garbageUDP answers every datagram with junk (or nothing when junk is nil).
func garbageUDP(t *testing.T, junk []byte) int {
	t.Helper()

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	done := make(chan struct{})

	go func() {
		defer close(done)

		buf := make([]byte, 1500)

		for {
			_, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}

			if junk != nil {
				_, _ = conn.WriteTo(junk, addr) //nolint:errcheck
			}
		}
	}()

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		<-done
	})

	return conn.LocalAddr().(*net.UDPAddr).Port //nolint:forcetypeassert
}

func TestBadBMCs(t *testing.T) {
	t.Parallel()

	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html><body>" + strings.Repeat("Login page ", 500) + "</body></html>")) //nolint:errcheck
	}))
	t.Cleanup(html.Close)

	fivehundred := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "internal error", http.StatusInternalServerError)
	}))
	t.Cleanup(fivehundred.Close)

	for _, tc := range []struct {
		name    string
		target  bmc.Target
		timeout bool
	}{
		{name: "ipmi answers garbage", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, []byte("\x06\x00\xff\x07garbage-garbage")), Protocol: bmc.ProtocolIPMI}, timeout: true},
		{name: "ipmi answers nothing", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, nil), Protocol: bmc.ProtocolIPMI}, timeout: true},
		{name: "redfish returns html", target: bmc.Target{Host: "127.0.0.1", RedfishEndpoint: html.URL, Protocol: bmc.ProtocolRedfish}},
		{name: "redfish returns 500", target: bmc.Target{Host: "127.0.0.1", RedfishEndpoint: fivehundred.URL, Protocol: bmc.ProtocolRedfish}},
		{name: "html is not redfish, ipmi silent", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, nil), RedfishEndpoint: html.URL}, timeout: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			m := manager(t)
			start := time.Now()

			_, err := m.PowerStatus(context.Background(), tc.target, creds)
			require.Error(t, err)
			require.Less(t, time.Since(start), 3*time.Second, "bounded wait")
			require.NotContains(t, err.Error(), creds.Password)
			require.Less(t, len(err.Error()), 1000, "error text is bounded: %s", err)

			if tc.timeout {
				require.ErrorIs(t, err, bmc.ErrTimeout)
			}
		})
	}
}

func TestInvalidInput(t *testing.T) {
	t.Parallel()

	m := manager(t)

	for _, tc := range []struct {
		name   string
		target bmc.Target
		creds  bmc.Credentials
	}{
		{name: "no host", creds: creds},
		{name: "bad port", target: bmc.Target{Host: "x", IPMIPort: 70000}, creds: creds},
		{name: "bad protocol", target: bmc.Target{Host: "x", Protocol: "telnet"}, creds: creds},
		{name: "bad endpoint", target: bmc.Target{Host: "x", RedfishEndpoint: "ftp://x"}, creds: creds},
		{name: "no user", target: bmc.Target{Host: "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.PowerStatus(t.Context(), tc.target, tc.creds)
			require.ErrorIs(t, err, bmc.ErrInvalidTarget)
		})
	}

	require.ErrorIs(t, m.SetPXEOnce(t.Context(), bmc.Target{Host: "x"}, creds, "floppy"), bmc.ErrInvalidTarget)
}

func TestCredentialsNeverFormat(t *testing.T) {
	t.Parallel()

	for _, s := range []string{
		creds.String(), creds.GoString(),
	} {
		require.NotContains(t, s, creds.Password)
		require.NotContains(t, s, creds.Username)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()

	require.NoError(t, bmc.Default().Validate())

	bad := bmc.Default()
	bad.ProbeTimeout = bad.CallTimeout + time.Second
	require.Error(t, bad.Validate())

	bad = bmc.Default()
	bad.IPMICipherSuites = nil
	require.Error(t, bad.Validate())
}
