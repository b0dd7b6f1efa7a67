package bmc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

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

	return fakeUDP(t, func([]byte) []byte { return junk })
}

// fakeUDP answers every datagram with what answer returns for it (nothing for nil).
func fakeUDP(t *testing.T, answer func(req []byte) []byte) int {
	t.Helper()

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	done := make(chan struct{})

	go func() {
		defer close(done)

		buf := make([]byte, 1500)

		for {
			n, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}

			if reply := answer(buf[:n]); reply != nil {
				_, _ = conn.WriteTo(reply, addr) //nolint:errcheck
			}
		}
	}()

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		<-done
	})

	return conn.LocalAddr().(*net.UDPAddr).Port
}

// ipmiReply answers an IPMI v1.5 session-less request (the Get Channel Authentication Capabilities that opens every
// session) with completion code cc and data, matching its sequence number and command so the client takes it as
// the answer (IPMI v2.0 §13.6, §13.8). Anything else gets no answer.
func ipmiReply(cc byte, data ...byte) func([]byte) []byte {
	return func(req []byte) []byte {
		// RMCP header (4), auth type none (1), sequence (4), session ID (4), length (1), then the message:
		// rsAddr, netFn/rsLUN, checksum, rqAddr, rqSeq/rqLUN, command, data, checksum.
		const msgAt = 14
		if len(req) < msgAt+7 || req[4] != 0x00 {
			return nil
		}

		m := req[msgAt:]
		msg := []byte{m[3], (m[1]>>2 + 1) << 2, 0, m[0], m[4], m[5], cc}
		msg[2] = -(msg[0] + msg[1])
		msg = append(msg, data...)

		var sum byte
		for _, b := range msg[3:] {
			sum += b
		}

		msg = append(msg, -sum)

		return append([]byte{0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, byte(len(msg))}, msg...)
	}
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

	ipmiTarget := func(answer func([]byte) []byte) bmc.Target {
		return bmc.Target{Host: "127.0.0.1", IPMIPort: fakeUDP(t, answer), Protocol: bmc.ProtocolIPMI}
	}

	for _, tc := range []struct {
		name      string
		target    bmc.Target
		timeout   bool
		permanent bool
		says      string
	}{
		{name: "ipmi answers garbage", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, []byte("\x06\x00\xff\x07garbage-garbage")), Protocol: bmc.ProtocolIPMI}, timeout: true},
		{name: "ipmi answers nothing", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, nil), Protocol: bmc.ProtocolIPMI}, timeout: true},
		{name: "ipmi answers a truncated reply", target: ipmiTarget(ipmiReply(0x00, 0x0e, 0x80)), says: "malformed reply from the bmc"},
		{name: "ipmi answers an empty reply", target: ipmiTarget(ipmiReply(0x00)), says: "malformed reply from the bmc"},
		{name: "ipmi answers invalid command", target: ipmiTarget(ipmiReply(0xc1)), permanent: true, says: "completion code 0xc1 (invalid command)"},
		{name: "ipmi answers insufficient privilege", target: ipmiTarget(ipmiReply(0xd4)), permanent: true, says: "completion code 0xd4 (cannot execute command, insufficient privilege"},
		{name: "ipmi answers node busy", target: ipmiTarget(ipmiReply(0xc0)), says: "completion code 0xc0 (node busy)"},
		{name: "redfish returns html", target: bmc.Target{Host: "127.0.0.1", RedfishEndpoint: html.URL, Protocol: bmc.ProtocolRedfish}, permanent: true, says: "html page where redfish json was expected"},
		{name: "redfish returns 500", target: bmc.Target{Host: "127.0.0.1", RedfishEndpoint: fivehundred.URL, Protocol: bmc.ProtocolRedfish}, says: "http status 500 (internal server error)"},
		{name: "html is not redfish, ipmi silent", target: bmc.Target{Host: "127.0.0.1", IPMIPort: garbageUDP(t, nil), RedfishEndpoint: html.URL}, timeout: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			m := manager(t)
			start := time.Now()

			_, err := m.PowerStatus(context.Background(), tc.target, creds)
			require.Error(t, err)
			t.Logf("%v", err)
			require.Less(t, time.Since(start), 3*time.Second, "bounded wait")
			require.NotContains(t, err.Error(), creds.Password)
			require.Less(t, len(err.Error()), 1000, "error text is bounded: %s", err)

			if tc.timeout {
				require.ErrorIs(t, err, bmc.ErrTimeout)
			} else {
				require.NotErrorIs(t, err, bmc.ErrTimeout, "the bmc answered: %v", err)
			}

			require.Equal(t, tc.permanent, bmc.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), tc.says)
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

	type withCreds struct {
		Host  string
		Creds bmc.Credentials
	}

	asJSON, err := json.Marshal(withCreds{Host: "10.0.0.5", Creds: creds})
	require.NoError(t, err)

	core, logs := observer.New(zapcore.DebugLevel)
	zap.New(core).Info("x", zap.Any("any", creds), zap.Reflect("reflect", creds), zap.Any("nested", withCreds{Creds: creds}))

	logged, err := json.Marshal(logs.All()[0].ContextMap())
	require.NoError(t, err)

	for name, s := range map[string]string{
		"String": creds.String(), "GoString": creds.GoString(),
		"%v": fmt.Sprintf("%v", creds), "%+v": fmt.Sprintf("%+v", creds), "%#v": fmt.Sprintf("%#v", creds),
		"%s": fmt.Sprintf("%s", creds), "%q": fmt.Sprintf("%q", creds), "%x": fmt.Sprintf("%x", creds),
		"%d": fmt.Sprintf("%d", creds), "in a struct": fmt.Sprintf("%+v", withCreds{Creds: creds}),
		"json": string(asJSON), "zap": string(logged),
	} {
		require.NotContains(t, s, creds.Password, name)
		require.NotContains(t, s, creds.Username, name)
		require.Contains(t, s, "[redacted]", name)
	}
}

// TestRedactionKeepsOtherWords: the edge's own text is never scrubbed, and a password is replaced in a library's
// text only as a whole word, so neither a one-character password nor one that is a common word mangles an error
// or spells itself out by where the marks fall.
func TestRedactionKeepsOtherWords(t *testing.T) {
	t.Parallel()

	silent := garbageUDP(t, nil)

	for _, password := range []string{"x", "power", "on", "bmc", "answer"} {
		t.Run(password, func(t *testing.T) {
			t.Parallel()

			c := bmc.Credentials{Username: "operator", Password: password}
			_, err := manager(t).PowerStatus(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: silent, Protocol: bmc.ProtocolIPMI}, c)
			require.ErrorIs(t, err, bmc.ErrTimeout)
			require.NotContains(t, err.Error(), "[redacted]", "nothing in this text is a credential")
			require.True(t, strings.HasPrefix(err.Error(), "power status on bmc 127.0.0.1: bmc did not answer in time"), err.Error())
			require.Contains(t, err.Error(), "expected rqSeq", "the library's words survive")
		})
	}
}

// TestRedactionReplacesEchoedPassword: a BMC that echoes the password in an error body has it replaced, whole.
func TestRedactionReplacesEchoedPassword(t *testing.T) {
	t.Parallel()

	for _, password := range []string{"x", "power", "hunter2-hunter2"} {
		t.Run(password, func(t *testing.T) {
			t.Parallel()

			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")

				if r.Method == http.MethodGet {
					_, _ = w.Write([]byte(`{"@odata.id":"/redfish/v1/","RedfishVersion":"1.6.0",` + //nolint:errcheck
						`"Links":{"Sessions":{"@odata.id":"/redfish/v1/SessionService/Sessions"}}}`))

					return
				}

				w.WriteHeader(http.StatusBadRequest)
				_, _ = fmt.Fprintf(w, `{"error":{"code":"Base.1.8.GeneralError","message":"expected a valid password, not %s (explained)"}}`, password) //nolint:errcheck
			}))
			t.Cleanup(srv.Close)

			c := bmc.Credentials{Username: "operator", Password: password}
			_, err := manager(t).PowerStatus(t.Context(), bmc.Target{Host: "127.0.0.1", RedfishEndpoint: srv.URL, Protocol: bmc.ProtocolRedfish}, c)
			require.Error(t, err)
			require.True(t, bmc.IsPermanent(err), "400 is permanent: %v", err)
			require.Contains(t, err.Error(), "http status 400 (bad request): expected a valid password, not [redacted] (explained)")
			require.True(t, strings.HasPrefix(err.Error(), "power status on bmc 127.0.0.1: open redfish session:"), err.Error())
		})
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
