package linklab_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/lab/tmpcheck"
	"github.com/outpost-metal/outpost/qemu/linklab"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
	"github.com/outpost-metal/outpost/shared/version"
)

// TestMain checks for leaked goroutines, and runs the tests in a temporary directory of their own that they
// must leave empty (tmpcheck).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(tmpcheck.Wrap(m))
}

// rejectedCount returns outpost_uplink_rejected_total{reason}.
func rejectedCount(t *testing.T, c *linklab.Controller, reason string) float64 {
	t.Helper()

	families, err := c.Metrics.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() != "outpost_uplink_rejected_total" {
			continue
		}

		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}

	return 0
}

func edgeStatus(ctx context.Context, conn grpc.ClientConnInterface) (*uplinkpb.EdgeStatus, error) {
	return uplinkpb.NewEdgeClient(conn).Status(ctx, &uplinkpb.EdgeStatusRequest{})
}

func TestEnrollThenMutualTLS(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	token := ctrl.CreateSite(t, "branch-1", sites.TokenOptions{})

	var fromEdge atomic.Pointer[uplinkpb.ControllerStatus]

	edge := linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{
		Counters: func() map[string]int64 { return map[string]int64{"dhcp_offers": 7} },
		OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, conn grpc.ClientConnInterface) error {
			st, err := uplinkpb.NewControllerClient(conn).Status(ctx, &uplinkpb.ControllerStatusRequest{})
			if err != nil {
				return err
			}

			fromEdge.Store(st)

			return nil
		}},
	}})

	conn := ctrl.WaitConnected(t, "branch-1")

	st, err := edgeStatus(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, "branch-1", st.GetSiteId())
	require.Equal(t, version.String(), st.GetEdgeVersion())
	require.EqualValues(t, 7, st.GetCounters()["dhcp_offers"])
	require.EqualValues(t, 1, st.GetCounters()["uplink_sessions"])

	require.Eventually(t, func() bool { return fromEdge.Load() != nil }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, "branch-1", fromEdge.Load().GetSiteId())
	require.True(t, fromEdge.Load().GetCertificateNotAfter().AsTime().After(time.Now()))

	for _, name := range []string{"uplink.key", "uplink.crt", "uplink-ca.crt"} {
		info, err := os.Stat(filepath.Join(edge.StateDir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), name)
	}

	// Restart without the token: the stored identity is enough, over mutual TLS.
	require.NoError(t, edge.Stop())
	require.Eventually(t, func() bool { return !ctrl.Server.Connected("branch-1") }, 5*time.Second, 5*time.Millisecond)

	linklab.StartEdge(t, ctrl.Addr, "", linklab.EdgeOptions{StateDir: edge.StateDir})
	conn = ctrl.WaitConnected(t, "branch-1")

	st, err = edgeStatus(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, "branch-1", st.GetSiteId())

	list, err := ctrl.Admin.ListSites(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, list.GetSites(), 1)
	require.True(t, list.GetSites()[0].GetConnected())
	require.True(t, list.GetSites()[0].GetEnrolled())
	require.Equal(t, version.String(), list.GetSites()[0].GetEdgeVersion())
}

func TestEnrollmentRefused(t *testing.T) {
	t.Parallel()

	var now atomic.Int64

	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }

	ctrl := linklab.StartController(t, linklab.ControllerOptions{Now: clock})
	other := linklab.StartController(t, linklab.ControllerOptions{})

	ctx := t.Context()

	// A token whose secret is wrong: the site's token was replaced after it was handed out.
	replaced := ctrl.CreateSite(t, "replaced", sites.TokenOptions{})
	_, _, err := ctrl.Registry.NewToken(ctx, "replaced", sites.TokenOptions{})
	require.NoError(t, err)

	expired := ctrl.CreateSite(t, "expired", sites.TokenOptions{TTL: time.Minute})

	used := ctrl.CreateSite(t, "used", sites.TokenOptions{})
	linklab.StartEdge(t, ctrl.Addr, used, linklab.EdgeOptions{})
	ctrl.WaitConnected(t, "used")

	deleted := ctrl.CreateSite(t, "deleted", sites.TokenOptions{})
	require.NoError(t, ctrl.Registry.Delete(ctx, "deleted"))

	foreign := other.CreateSite(t, "foreign", sites.TokenOptions{})

	revoked := ctrl.CreateSite(t, "revoked", sites.TokenOptions{})
	require.NoError(t, ctrl.Registry.Revoke(ctx, "revoked"))

	now.Add(int64(2 * time.Minute)) // past the expired token's TTL, well within the others' 24h

	for _, tc := range []struct {
		name, token, want string
	}{
		{"wrong secret", replaced, "not the site's current token"},
		{"expired", expired, "join token expired"},
		{"reused", used, "already used"},
		{"deleted site", deleted, "unknown site"},
		{"other controller", foreign, "does not match the join token's fingerprint"},
		{"revoked site", revoked, "site revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			edge := linklab.StartEdge(t, ctrl.Addr, tc.token, linklab.EdgeOptions{})
			err := edge.Wait(t, 10*time.Second)

			var enrollErr *edgeuplink.EnrollError

			require.ErrorAs(t, err, &enrollErr)
			require.ErrorContains(t, err, tc.want)
			require.NoDirExists(t, filepath.Join(edge.StateDir, "uplink.crt"))
		})
	}
}

func TestRevokedSiteIsDisconnectedAndRefused(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	token := ctrl.CreateSite(t, "doomed", sites.TokenOptions{})

	core, logs := observer.New(zap.InfoLevel)
	linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{Logger: zap.New(core)}})
	ctrl.WaitConnected(t, "doomed")

	_, err := ctrl.Admin.RevokeSite(t.Context(), &adminpb.RevokeSiteRequest{SiteId: "doomed"})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return rejectedCount(t, ctrl, "revoked") >= 1 }, 10*time.Second, 10*time.Millisecond)
	// The old session's teardown may still be finishing when the reconnect is refused.
	require.Eventually(t, func() bool { return !ctrl.Server.Connected("doomed") }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return logs.FilterMessage("uplink rejected").FilterField(zap.String("reason", `site "doomed" has been revoked`)).Len() > 0
	}, 10*time.Second, 10*time.Millisecond)
}

// TestSiteRevokedElsewhereIsDisconnected: a site revoked (or deleted) by another writer of the same store, as a
// standby controller's admin socket writes Omni, loses its session on the controller that holds it.
func TestSiteRevokedElsewhereIsDisconnected(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		change func(*sites.Registry, string) error
	}{
		{"revoked", func(r *sites.Registry, id string) error { return r.Revoke(context.Background(), id) }},
		{"deleted", func(r *sites.Registry, id string) error { return r.Delete(context.Background(), id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			ctrl := linklab.StartController(t, linklab.ControllerOptions{})
			token := ctrl.CreateSite(t, "elsewhere", sites.TokenOptions{})
			kept := ctrl.CreateSite(t, "kept", sites.TokenOptions{})

			linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{})
			linklab.StartEdge(t, ctrl.Addr, kept, linklab.EdgeOptions{})
			ctrl.WaitConnected(t, "elsewhere")
			ctrl.WaitConnected(t, "kept")

			other := sites.NewRegistry(ctrl.State, ctrl.CA, rand.Reader, time.Now)
			require.NoError(t, tc.change(other, "elsewhere"))

			require.Eventually(t, func() bool { return !ctrl.Server.Connected("elsewhere") }, 10*time.Second, 10*time.Millisecond,
				"the session of a site %s elsewhere went on", tc.name)
			require.Never(t, func() bool { return !ctrl.Server.Connected("kept") }, time.Second, 20*time.Millisecond,
				"another site's session was ended")
		})
	}
}

func TestProtocolVersionMismatchExplainedAtBothEnds(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zap.InfoLevel)
	ctrl := linklab.StartController(t, linklab.ControllerOptions{Logger: zap.New(core)})

	// Controller end: an edge from the future.
	reply := rawHello(t, ctrl.Addr, version.ProtocolVersion+1, &uplinkpb.Hello{SiteId: "x", Purpose: uplinkpb.Hello_PURPOSE_ENROLL})
	require.Equal(t, uplinkpb.HelloReply_CODE_PROTOCOL_VERSION, reply.GetCode())
	require.Contains(t, reply.GetReason(), "speaks uplink protocol 2")
	require.EqualValues(t, version.ProtocolVersion, reply.GetProtocolVersion())
	require.Equal(t, 1.0, rejectedCount(t, ctrl, "protocol_version"))
	require.Equal(t, 1, logs.FilterMessage("uplink connection rejected").Len())

	// Edge end: a controller from the future answers every hello with a mismatch.
	addr := fakeController(t, ctrl.CA, func(conn net.Conn) {
		_, err := uplink.ReadFrame(conn)
		if err != nil {
			return
		}

		uplink.WriteFrame(conn, 9, &uplinkpb.HelloReply{ //nolint:errcheck
			Code:              uplinkpb.HelloReply_CODE_PROTOCOL_VERSION,
			Reason:            "the edge speaks uplink protocol 1, this controller (v9.0.0) speaks 9",
			ProtocolVersion:   9,
			ControllerVersion: "v9.0.0",
		})
	})

	edgeCore, edgeLogs := observer.New(zap.InfoLevel)
	edgeDir := t.TempDir()
	enrolled := linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, "future", sites.TokenOptions{}), linklab.EdgeOptions{StateDir: edgeDir})
	ctrl.WaitConnected(t, "future")
	require.NoError(t, enrolled.Stop())

	linklab.StartEdge(t, addr, "", linklab.EdgeOptions{StateDir: edgeDir, Options: edgeuplink.Options{Logger: zap.New(edgeCore)}})
	require.Eventually(t, func() bool {
		return edgeLogs.FilterMessage("uplink rejected").FilterField(zap.String("reason", "the edge speaks uplink protocol 1, this controller (v9.0.0) speaks 9")).Len() > 0
	}, 10*time.Second, 10*time.Millisecond)
}

func TestTCPCutReconnectsAndCallsResume(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	proxy := linklab.StartProxy(t, ctrl.Addr)

	var sessions atomic.Int32

	edge := linklab.StartEdge(t, proxy.Addr, ctrl.CreateSite(t, "wan", sites.TokenOptions{}), linklab.EdgeOptions{Options: edgeuplink.Options{
		OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, _ grpc.ClientConnInterface) error {
			sessions.Add(1)
			<-ctx.Done()

			return nil
		}},
	}})

	conn := ctrl.WaitConnected(t, "wan")
	_, err := edgeStatus(t.Context(), conn)
	require.NoError(t, err)

	// A stream in flight when the link dies fails; it must not hang.
	proxy.Cut()

	require.Eventually(t, func() bool {
		c, err := ctrl.Server.Conn("wan")
		if err != nil {
			return false
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()

		st, err := edgeStatus(ctx, c)

		return err == nil && st.GetCounters()["uplink_sessions"] == 2
	}, 15*time.Second, 20*time.Millisecond)

	// The session handlers start just after the session is counted.
	require.Eventually(t, func() bool { return sessions.Load() == 2 }, 10*time.Second, 10*time.Millisecond)
	require.True(t, edge.Client.Connected())
}

func TestSecondSessionReplacesFirst(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})

	var mu sync.Mutex

	ended := map[string]bool{}
	handler := func(name string) edgeuplink.SessionFunc {
		return func(ctx context.Context, _ grpc.ClientConnInterface) error {
			<-ctx.Done()
			mu.Lock()
			ended[name] = true
			mu.Unlock()

			return nil
		}
	}

	dirA := t.TempDir()
	a := linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, "twin", sites.TokenOptions{}), linklab.EdgeOptions{
		StateDir: dirA,
		Options: edgeuplink.Options{
			OnSession: []edgeuplink.SessionFunc{handler("a")},
			Counters:  func() map[string]int64 { return map[string]int64{"edge_a": 1} },
		},
		// After losing its session, A waits long enough for the test to see B in charge.
		Configure: func(c *edgeuplink.Config) { c.BackoffMin, c.BackoffMax = time.Hour, time.Hour },
	})
	ctrl.WaitConnected(t, "twin")

	// B is the same site (its state directory is a copy of A's), like an edge whose old TCP connection is half-open.
	dirB := t.TempDir()
	for _, name := range []string{"uplink.key", "uplink.crt", "uplink-ca.crt"} {
		data, err := os.ReadFile(filepath.Join(dirA, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dirB, name), data, 0o600))
	}

	linklab.StartEdge(t, ctrl.Addr, "", linklab.EdgeOptions{StateDir: dirB, Options: edgeuplink.Options{
		Counters: func() map[string]int64 { return map[string]int64{"edge_b": 1} },
	}})

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()

		return ended["a"]
	}, 10*time.Second, 10*time.Millisecond, "the first session was not closed")

	require.Eventually(t, func() bool {
		c, err := ctrl.Server.Conn("twin")
		if err != nil {
			return false
		}

		st, err := edgeStatus(t.Context(), c)

		return err == nil && st.GetCounters()["edge_b"] == 1
	}, 10*time.Second, 10*time.Millisecond)
	// The replaced edge notices its session ended once its teardown is done.
	require.Eventually(t, func() bool { return !a.Client.Connected() }, 10*time.Second, 10*time.Millisecond)
}

func TestConcurrentCallsBothDirections(t *testing.T) {
	t.Parallel()

	const calls = 64

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})

	edgeDone := make(chan error, 1)

	linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, "busy", sites.TokenOptions{}), linklab.EdgeOptions{Options: edgeuplink.Options{
		OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, conn grpc.ClientConnInterface) error {
			var eg errgroup.Group

			for range calls {
				eg.Go(func() error {
					st, err := uplinkpb.NewControllerClient(conn).Status(ctx, &uplinkpb.ControllerStatusRequest{})
					if err == nil && st.GetSiteId() != "busy" {
						t.Errorf("controller answered for site %q", st.GetSiteId())
					}

					return err
				})
			}

			edgeDone <- eg.Wait()

			return nil
		}},
	}})

	conn := ctrl.WaitConnected(t, "busy")

	var eg errgroup.Group

	for range calls {
		eg.Go(func() error {
			_, err := edgeStatus(t.Context(), conn)

			return err
		})
	}

	require.NoError(t, eg.Wait())
	require.NoError(t, <-edgeDone)
}

func TestEdgeCannotNameAnotherSite(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	ctrl.CreateSite(t, "victim", sites.TokenOptions{})

	dir := t.TempDir()
	e := linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, "attacker", sites.TokenOptions{}), linklab.EdgeOptions{StateDir: dir})
	ctrl.WaitConnected(t, "attacker")
	require.NoError(t, e.Stop())

	id, err := edgeuplink.LoadIdentity(dir)
	require.NoError(t, err)

	// The attacker's certificate with a hello that names the victim.
	conn, err := tls.Dial("tcp", ctrl.Addr, uplink.SessionTLSConfig(id.Cert, id.CA))
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	require.NoError(t, uplink.WriteFrame(conn, version.ProtocolVersion, &uplinkpb.Hello{SiteId: "victim", Purpose: uplinkpb.Hello_PURPOSE_SESSION}))
	reply := readReply(t, conn)
	require.Equal(t, uplinkpb.HelloReply_CODE_SITE_MISMATCH, reply.GetCode())
	require.Contains(t, reply.GetReason(), `certificate is for site "attacker" but the hello names site "victim"`)
	require.False(t, ctrl.Server.Connected("victim"))
	require.Equal(t, 1.0, rejectedCount(t, ctrl, "site_mismatch"))
}

func TestBadInputNeverBlocksOtherEdges(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	other := linklab.StartController(t, linklab.ControllerOptions{})

	// A connection that says nothing at all holds a handshake slot until its timeout, and no longer.
	silent, err := net.Dial("tcp", ctrl.Addr)
	require.NoError(t, err)

	defer silent.Close() //nolint:errcheck

	// Random bytes instead of TLS.
	junk, err := net.Dial("tcp", ctrl.Addr)
	require.NoError(t, err)

	_, err = junk.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\x13\x37"))
	require.NoError(t, err)
	junk.Close() //nolint:errcheck

	// TLS, then garbage instead of a hello.
	garbage, err := tls.Dial("tcp", ctrl.Addr, uplink.EnrollTLSConfig(ctrl.CA.Fingerprint()))
	require.NoError(t, err)

	_, err = garbage.Write([]byte("OPUL\x00\x01\xff\xffnot protobuf at all"))
	require.NoError(t, err)
	garbage.Close() //nolint:errcheck

	// A client certificate from another controller's CA.
	foreignDir := t.TempDir()
	fe := linklab.StartEdge(t, other.Addr, other.CreateSite(t, "stranger", sites.TokenOptions{}), linklab.EdgeOptions{StateDir: foreignDir})
	other.WaitConnected(t, "stranger")
	require.NoError(t, fe.Stop())

	foreignID, err := edgeuplink.LoadIdentity(foreignDir)
	require.NoError(t, err)

	// The foreign edge trusts our CA (as if misconfigured) but presents its own certificate.
	cfg := uplink.SessionTLSConfig(foreignID.Cert, ctrl.CA.Certificate())
	fconn, err := tls.Dial("tcp", ctrl.Addr, cfg)
	require.NoError(t, err)

	defer fconn.Close() //nolint:errcheck

	require.NoError(t, uplink.WriteFrame(fconn, version.ProtocolVersion, &uplinkpb.Hello{SiteId: "stranger", Purpose: uplinkpb.Hello_PURPOSE_SESSION}))
	reply := readReply(t, fconn)
	require.Equal(t, uplinkpb.HelloReply_CODE_BAD_CERTIFICATE, reply.GetCode())
	require.Contains(t, reply.GetReason(), "certificate signed by unknown authority")

	// Meanwhile a real edge enrols and connects without waiting for any of the above.
	linklab.StartEdge(t, ctrl.Addr, ctrl.CreateSite(t, "good", sites.TokenOptions{}), linklab.EdgeOptions{})
	ctrl.WaitConnected(t, "good")

	require.Eventually(t, func() bool {
		return rejectedCount(t, ctrl, "tls_handshake") >= 1 && rejectedCount(t, ctrl, "malformed_hello") >= 1
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 1.0, rejectedCount(t, ctrl, "bad_certificate"))
}

// rawHello sends one hello over TLS (pinning the controller like an enrolling edge) and returns the reply.
func rawHello(t *testing.T, addr string, protocol uint16, hello *uplinkpb.Hello) *uplinkpb.HelloReply {
	t.Helper()

	conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}) // test
	require.NoError(t, err)

	defer conn.Close() //nolint:errcheck

	require.NoError(t, uplink.WriteFrame(conn, protocol, hello))

	return readReply(t, conn)
}

func readReply(t *testing.T, conn net.Conn) *uplinkpb.HelloReply {
	t.Helper()

	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck

	frame, err := uplink.ReadFrame(conn)
	require.NoError(t, err)

	reply, err := uplink.DecodeHelloReply(frame.Payload)
	require.NoError(t, err)

	return reply
}

// fakeController serves TLS with a certificate from a throwaway CA and hands each connection to fn.
func fakeController(t *testing.T, ca *sites.CA, fn func(net.Conn)) string {
	t.Helper()

	cert, err := ca.ServerCertificate(time.Now())
	require.NoError(t, err)

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})
	require.NoError(t, err)

	var wg sync.WaitGroup

	t.Cleanup(func() {
		ln.Close() //nolint:errcheck
		wg.Wait()
	})

	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}

			wg.Go(func() {
				defer conn.Close() //nolint:errcheck

				fn(conn)
			})
		}
	})

	return ln.Addr().String()
}

func TestCertificateRenewal(t *testing.T) {
	t.Parallel()

	// Certificates live four seconds, so the edge renews after about two and a half.
	ctrl := linklab.StartController(t, linklab.ControllerOptions{CertValidity: 4 * time.Second})
	proxy := linklab.StartProxy(t, ctrl.Addr)
	edge := linklab.StartEdge(t, proxy.Addr, ctrl.CreateSite(t, "renew", sites.TokenOptions{}), linklab.EdgeOptions{})
	ctrl.WaitConnected(t, "renew")

	first, err := edgeuplink.LoadIdentity(edge.StateDir)
	require.NoError(t, err)

	var renewed *edgeuplink.Identity

	require.Eventually(t, func() bool {
		id, err := edgeuplink.LoadIdentity(edge.StateDir)
		if err != nil || id.Cert.Leaf.SerialNumber.Cmp(first.Cert.Leaf.SerialNumber) == 0 {
			return false
		}

		renewed = id

		return true
	}, 15*time.Second, 20*time.Millisecond, "the edge never renewed its certificate")

	require.True(t, renewed.Cert.Leaf.NotAfter.After(first.Cert.Leaf.NotAfter))

	// The next session (after a WAN blip) authenticates with the renewed certificate.
	proxy.Cut()
	require.Eventually(t, func() bool {
		st, err := sites.Status(t.Context(), ctrl.State, "renew")

		return err == nil && st.TypedSpec().Value.GetSessions() >= 2 && ctrl.Server.Connected("renew")
	}, 15*time.Second, 20*time.Millisecond)
	require.Zero(t, rejectedCount(t, ctrl, "bad_certificate"))
}
