package linklab_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
	"github.com/outpost-metal/outpost/shared/version"
)

// pinned is the TLS configuration of an enrolling edge: the controller pinned by the token's CA fingerprint.
func pinned(fp [sha256.Size]byte) *tls.Config { return uplink.EnrollTLSConfig(fp) }

// enrollHello connects to addr from the loopback address ip, does TLS with cfg, and sends an enrolment hello for
// siteID with token. It returns the connection (nil when the controller closed it before TLS) and the reply.
func enrollHello(ctx context.Context, addr, ip string, cfg *tls.Config, siteID, token string) (*tls.Conn, *uplinkpb.HelloReply, error) {
	raw, err := linklab.DialFrom(ip)(ctx, addr)
	if err != nil {
		return nil, nil, err
	}

	conn := tls.Client(raw, cfg)
	conn.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck

	if err := conn.HandshakeContext(ctx); err != nil {
		conn.Close() //nolint:errcheck

		return nil, nil, err
	}

	hello := &uplinkpb.Hello{SiteId: siteID, EdgeVersion: version.String(), Purpose: uplinkpb.Hello_PURPOSE_ENROLL, JoinToken: token}
	if err := uplink.WriteFrame(conn, version.ProtocolVersion, hello); err != nil {
		conn.Close() //nolint:errcheck

		return nil, nil, err
	}

	frame, err := uplink.ReadFrame(conn)
	if err != nil {
		conn.Close() //nolint:errcheck

		return nil, nil, err
	}

	reply, err := uplink.DecodeHelloReply(frame.Payload)
	if err != nil {
		conn.Close() //nolint:errcheck

		return nil, nil, err
	}

	conn.SetDeadline(time.Time{}) //nolint:errcheck

	return conn, reply, nil
}

// wrongToken returns tok with another secret: the right site and controller, the wrong secret.
func wrongToken(t *testing.T, token string) string {
	t.Helper()

	tok, err := uplink.ParseJoinToken(token)
	require.NoError(t, err)

	tok.Secret = make([]byte, uplink.SecretLen)
	_, err = rand.Read(tok.Secret)
	require.NoError(t, err)

	return tok.String()
}

func newCSR(t *testing.T, siteID string) []byte {
	t.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: siteID}}, key)
	require.NoError(t, err)

	return csr
}

// waitClosed reports when the peer closes conn (or the bound passes), reading and discarding what it sends.
func waitClosed(conn net.Conn, bound time.Duration) time.Duration {
	start := time.Now()
	conn.SetReadDeadline(start.Add(bound)) //nolint:errcheck
	io.Copy(io.Discard, conn)              //nolint:errcheck

	return time.Since(start)
}

// 1,000 wrong secrets used to be checked in 836 ms on one session, each with a certificate signed first.
// Now the token is checked in the hello, one connection at a time: five wrong ones lock the address out,
// the connections after those are refused (locked out, or closed before TLS for their rate), and no
// certificate is signed for any of them.
func TestWrongJoinTokensInALoopAreLimited(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	token := ctrl.CreateSite(t, "target", sites.TokenOptions{})
	fp := ctrl.CA.Fingerprint()

	// As fast as the controller answers: at least 1,000 attempts, and on until the lockout has been seen.
	const attempts = 1000

	outcomes := map[string]int{}

	var (
		lockedReply *uplinkpb.HelloReply
		tried       int
	)

	start := time.Now()

	for ; tried < attempts || lockedReply == nil; tried++ {
		require.Less(t, time.Since(start), time.Minute, "no lockout after %d attempts: %v", tried, outcomes)

		conn, reply, err := enrollHello(t.Context(), ctrl.Addr, "127.0.5.1", pinned(fp), "target", wrongToken(t, token))
		if err != nil {
			outcomes["closed before the hello reply"]++

			continue
		}

		conn.Close() //nolint:errcheck

		outcomes[reply.GetCode().String()]++

		if reply.GetCode() == uplinkpb.HelloReply_CODE_LOCKED_OUT {
			lockedReply = reply
		}
	}

	elapsed := time.Since(start)

	t.Logf("%d wrong secrets from one address in %s: %v; certificates signed: %d", tried, elapsed.Round(time.Millisecond), outcomes, ctrl.CA.Issued())

	require.Equal(t, 5, outcomes["CODE_TOKEN_REJECTED"], "the limit of wrong tokens per address")
	require.Positive(t, outcomes["CODE_LOCKED_OUT"])
	require.Equal(t, tried, outcomes["CODE_TOKEN_REJECTED"]+outcomes["CODE_LOCKED_OUT"]+outcomes["closed before the hello reply"])
	require.Contains(t, lockedReply.GetReason(), "too many wrong join tokens from 127.0.5.1 (5 within 10m0s): enrolment from this address is locked until")
	require.InDelta(t, (5 * time.Minute).Seconds(), lockedReply.GetRetryAfter().AsDuration().Seconds(), 30)
	require.Zero(t, ctrl.CA.Issued(), "a certificate was signed for a wrong token")
	require.Equal(t, 1.0, counter(t, ctrl, "outpost_uplink_lockouts_total", "scope", "source"))
	require.EqualValues(t, outcomes["closed before the hello reply"], rejectedCount(t, ctrl, "source_rate")+rejectedCount(t, ctrl, "source_handshakes"))

	// A session given for the right token cannot be used to try another, nor to try twice.
	conn, reply, err := enrollHello(t.Context(), ctrl.Addr, "127.0.5.2", pinned(fp), "target", token)
	require.NoError(t, err)
	require.Equal(t, uplinkpb.HelloReply_CODE_ACCEPTED, reply.GetCode(), reply.GetReason())

	sess, err := yamux.Client(conn, uplink.YamuxConfig(zap.NewNop()))
	require.NoError(t, err)

	peer, err := uplink.NewPeer(sess)
	require.NoError(t, err)

	defer peer.Close()

	enroll := uplinkpb.NewEnrollmentClient(peer.Conn())

	_, err = enroll.Enroll(t.Context(), &uplinkpb.EnrollRequest{Token: wrongToken(t, token), Csr: newCSR(t, "target")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "the join token differs from the one in the hello")

	_, err = enroll.Enroll(t.Context(), &uplinkpb.EnrollRequest{Token: token, Csr: newCSR(t, "target")})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "one enrolment per connection")
	require.Zero(t, ctrl.CA.Issued())

	// The session ends shortly after its one call.
	require.Less(t, waitClosed(conn, 10*time.Second), 8*time.Second)

	// A real edge at another address enrols with the right token: the one certificate signed.
	linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{})
	ctrl.WaitConnected(t, "target")
	require.EqualValues(t, 1, ctrl.CA.Issued())
}

// Wrong tokens for one site from many addresses (none of them over its own limit) pause that site's enrolment;
// the real edge is told why and for how long, waits that long and enrols.
func TestSiteLockoutPausesEnrolmentAndTheEdgeWaitsAsTold(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zap.InfoLevel)
	ctrl := linklab.StartController(t, linklab.ControllerOptions{
		Logger: zap.New(core),
		Limits: sites.Limits{SiteLockout: 3 * time.Second},
	})
	token := ctrl.CreateSite(t, "target", sites.TokenOptions{})

	for i := range 20 {
		conn, reply, err := enrollHello(t.Context(), ctrl.Addr, "127.0.6."+strconv.Itoa(i+1), pinned(ctrl.CA.Fingerprint()), "target", wrongToken(t, token))
		require.NoError(t, err)
		conn.Close() //nolint:errcheck
		require.Equal(t, uplinkpb.HelloReply_CODE_TOKEN_REJECTED, reply.GetCode())
	}

	locked := time.Now()

	edgeCore, edgeLogs := observer.New(zap.InfoLevel)
	linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{Logger: zap.New(edgeCore)}})
	ctrl.WaitConnected(t, "target")

	waited := time.Since(locked)
	t.Logf("site locked out for 3s after 20 wrong tokens from 20 addresses: the real edge enrolled after %s", waited.Round(time.Millisecond))

	require.GreaterOrEqual(t, waited, 2*time.Second, "the edge enrolled during the lockout")

	retries := edgeLogs.FilterMessage("enrolment failed; retrying").All()
	require.NotEmpty(t, retries)
	require.Contains(t, retries[0].ContextMap()["error"], `too many wrong join tokens for site "target"`)
	require.GreaterOrEqual(t, retries[0].ContextMap()["retry_in"], 2*time.Second)

	lockLines := logs.FilterMessage("uplink enrolment locked out").All()
	require.Len(t, lockLines, 1)
	require.Contains(t, lockLines[0].ContextMap()["reason"], `20 wrong join tokens for site "target" within 10m0s`)
	require.Equal(t, 1.0, counter(t, ctrl, "outpost_uplink_lockouts_total", "scope", "site"))
	require.EqualValues(t, 1, ctrl.CA.Issued())
}

// Enrolment sessions are bounded in number (here two per site) and in time (here one second), and a hello
// without a token (an older edge) is told why it is refused.
func TestEnrolmentSessionsAreBoundedAndShortLived(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{Limits: sites.Limits{SiteEnrollSessions: 2, EnrollTimeout: time.Second}})
	token := ctrl.CreateSite(t, "leaky", sites.TokenOptions{Reusable: true})
	fp := ctrl.CA.Fingerprint()

	var held []*tls.Conn

	for i := range 2 {
		conn, reply, err := enrollHello(t.Context(), ctrl.Addr, "127.0.7."+strconv.Itoa(i+1), pinned(fp), "leaky", token)
		require.NoError(t, err)
		require.Equal(t, uplinkpb.HelloReply_CODE_ACCEPTED, reply.GetCode(), reply.GetReason())

		held = append(held, conn)
	}

	conn, reply, err := enrollHello(t.Context(), ctrl.Addr, "127.0.7.3", pinned(fp), "leaky", token)
	require.NoError(t, err)
	conn.Close() //nolint:errcheck
	require.Equal(t, uplinkpb.HelloReply_CODE_OVERLOADED, reply.GetCode())
	require.Contains(t, reply.GetReason(), `site "leaky" already has 2 enrolment sessions open (limit 2 per site)`)
	require.Equal(t, 5*time.Second, reply.GetRetryAfter().AsDuration())

	// Sessions that never enrol end at their lifetime.
	for _, c := range held {
		require.Less(t, waitClosed(c, 10*time.Second), 5*time.Second)
		c.Close() //nolint:errcheck
	}

	require.Eventually(t, func() bool { return gauge(t, ctrl, "outpost_uplink_enroll_sessions") == 0 }, 5*time.Second, 10*time.Millisecond)

	conn, reply, err = enrollHello(t.Context(), ctrl.Addr, "127.0.7.3", pinned(fp), "leaky", token)
	require.NoError(t, err)
	conn.Close() //nolint:errcheck
	require.Equal(t, uplinkpb.HelloReply_CODE_ACCEPTED, reply.GetCode(), reply.GetReason())

	conn, reply, err = enrollHello(t.Context(), ctrl.Addr, "127.0.7.4", pinned(fp), "leaky", "")
	require.NoError(t, err)
	conn.Close() //nolint:errcheck
	require.Equal(t, uplinkpb.HelloReply_CODE_MALFORMED, reply.GetCode())
	require.Contains(t, reply.GetReason(), "the enrolment hello carries no join token")
	require.Zero(t, ctrl.CA.Issued())
}

// A connection that does not complete TLS quickly is closed (3 s by default), an address holds 16 connections
// in TLS or hello at most, and the rest from it are closed at once; an edge elsewhere is not held up.
func TestIdleConnectionsAreClosedBeforeTLS(t *testing.T) {
	t.Parallel()

	ctrl := linklab.StartController(t, linklab.ControllerOptions{})
	token := ctrl.CreateSite(t, "busy", sites.TokenOptions{})

	const idle = 40

	var (
		wg     sync.WaitGroup
		closed [idle]time.Duration
	)

	for i := range idle {
		conn, err := linklab.DialFrom("127.0.8.1")(t.Context(), ctrl.Addr)
		require.NoError(t, err)

		wg.Go(func() {
			defer conn.Close() //nolint:errcheck

			closed[i] = waitClosed(conn, 15*time.Second)
		})
	}

	start := time.Now()

	linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{})
	ctrl.WaitConnected(t, "busy")

	enrolled := time.Since(start)

	wg.Wait()

	var atOnce, atTimeout int

	for _, d := range closed {
		switch {
		case d < time.Second:
			atOnce++
		case d < 6*time.Second:
			atTimeout++
		}
	}

	t.Logf("%d idle connections from one address: %d closed at once, %d at the TLS timeout; an edge elsewhere enrolled in %s meanwhile",
		idle, atOnce, atTimeout, enrolled.Round(time.Millisecond))

	require.Equal(t, idle-16, atOnce)
	require.Equal(t, 16, atTimeout)
	require.Less(t, enrolled, 3*time.Second)
	require.Eventually(t, func() bool {
		return rejectedCount(t, ctrl, "tls_timeout") == 16 && rejectedCount(t, ctrl, "source_handshakes") == idle-16
	}, 5*time.Second, 10*time.Millisecond)
}

// counter returns a counter of ctrl's metrics with the given label.
func counter(t *testing.T, c *linklab.Controller, name, label, value string) float64 {
	t.Helper()

	families, err := c.Metrics.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() != name {
			continue
		}

		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}

	return 0
}

// gauge returns an unlabelled gauge of ctrl's metrics.
func gauge(t *testing.T, c *linklab.Controller, name string) float64 {
	t.Helper()

	families, err := c.Metrics.Gather()
	require.NoError(t, err)

	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}

	return 0
}
