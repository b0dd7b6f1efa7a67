package sites

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cosi-project/runtime/pkg/state"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
	"github.com/outpost-metal/outpost/shared/version"
)

// SessionFunc runs for the life of one site session. conn reaches the edge's gRPC services;
// ctx ends when the session does. An error is logged; it does not end the session.
type SessionFunc func(ctx context.Context, siteID string, conn grpc.ClientConnInterface) error

// Options configure a Server. Logger, Registry, CA and State are required.
type Options struct {
	Logger   *zap.Logger
	Registry *Registry
	CA       *CA
	// Statuses receives the SiteStatus resources (connection state).
	Statuses state.State
	// Metrics registers the uplink's counters; nil means a private registry.
	Metrics prometheus.Registerer
	// Now dates certificates and site statuses; nil means time.Now. Socket deadlines and the limits' rates and
	// windows run on the real clock, so that a test's frozen Now cannot freeze them.
	Now func() time.Time

	// Register adds controller-served services to every site session's gRPC server.
	Register []func(grpc.ServiceRegistrar)
	// ServerOptions are added to every site session's gRPC server.
	ServerOptions []grpc.ServerOption
	// OnSession functions run for the life of each site session.
	OnSession []SessionFunc

	// CertValidity is the lifetime of the client certificates issued to edges.
	CertValidity time.Duration
	// Limits bound handshakes, enrolment sessions and wrong join tokens; zero fields mean their defaults.
	Limits Limits
	// ServerNames are extra DNS names for the server certificate (the fixed uplink name is always there).
	ServerNames []string
	// Version is the controller's release as edges are told and held to (version.CheckEdge); empty means
	// version.String(), the build's own.
	Version string
}

// Defaults for Options.
const (
	DefaultCertValidity = 30 * 24 * time.Hour
	lastSeenInterval    = 15 * time.Second
	// enrollLinger is how long an enrolment session stays open after its one Enroll call has returned,
	// for the answer to reach the edge (which closes the session itself once it has it).
	enrollLinger = 2 * time.Second
)

// ErrSiteOffline means the site has no live uplink session; the caller should try again later.
var ErrSiteOffline = errors.New("site offline")

// Server accepts edge connections: enrolment and authenticated site sessions.
type Server struct {
	opts      Options
	log       *zap.Logger
	metrics   *metrics
	tlsConfig *tls.Config
	admission *admission
	rejects   *rejectLog
	table     sessionTable
	statuses  *statusKeeper
	refusals  releaseRefusals
}

// NewServer builds a server; call Serve with a listener.
func NewServer(opts Options) (*Server, error) {
	if opts.Logger == nil || opts.Registry == nil || opts.CA == nil || opts.Statuses == nil {
		return nil, errors.New("sites server: logger, registry, CA and status writer are required")
	}

	if opts.Now == nil {
		opts.Now = time.Now
	}

	if opts.CertValidity <= 0 {
		opts.CertValidity = DefaultCertValidity
	}

	if opts.Version == "" {
		opts.Version = version.String()
	}

	if err := opts.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("sites server: %w", err)
	}

	opts.Limits = opts.Limits.withDefaults()

	if opts.Metrics == nil {
		opts.Metrics = prometheus.NewRegistry()
	}

	m, err := newMetrics(opts.Metrics)
	if err != nil {
		return nil, fmt.Errorf("sites server metrics: %w", err)
	}

	cert, err := opts.CA.ServerCertificate(opts.Now(), opts.ServerNames...)
	if err != nil {
		return nil, err
	}

	log := opts.Logger.With(zap.String("component", "uplink_server"))

	s := &Server{
		opts:    opts,
		log:     log,
		metrics: m,
		tlsConfig: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{cert},
			// Client certificates are verified after the handshake, so that a certificate from another CA
			// gets a clear reject reason in the hello reply instead of a bare TLS alert.
			ClientAuth: tls.RequestClientCert,
		},
		admission: newAdmission(opts.Limits, time.Now, m),
		rejects:   newRejectLog(log, opts.Limits.RejectLogInterval, time.Now),
		table:     sessionTable{bySite: map[string]*liveSession{}},
		statuses:  &statusKeeper{w: opts.Statuses, now: opts.Now},
	}

	return s, nil
}

// Serve accepts connections on ln until ctx is done, then closes every session and returns nil.
//
// A connection is counted against the handshake limits from accept until its hello is answered: refused at
// once (closed, counted, logged at most once per reason and interval) when its source or the controller is at
// a limit, closed when it has not completed TLS within Limits.TLSTimeout or sent its hello within
// Limits.HandshakeTimeout.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("uplink listening", zap.Stringer("address", ln.Addr()))

	stop := context.AfterFunc(ctx, func() { ln.Close() }) //nolint:errcheck
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()

	housekeeping, stopHousekeeping := context.WithCancel(ctx)
	defer stopHousekeeping()

	wg.Go(func() { s.housekeep(housekeeping) })
	wg.Go(func() { s.followRevocations(housekeeping) })

	var acceptDelay time.Duration

	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}

			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}

			if !temporaryAcceptError(err) {
				return fmt.Errorf("accept uplink connection: %w", err)
			}

			// Out of file descriptors (a flood) or a connection reset before accept: wait a little, as
			// net/http does, instead of spinning or giving up the port.
			acceptDelay = min(max(2*acceptDelay, 5*time.Millisecond), time.Second)
			s.metrics.rejected.WithLabelValues(reasonInternal).Inc()
			s.rejects.reject(zapcore.WarnLevel, "uplink accept failed", reasonInternal,
				fmt.Sprintf("%v; retrying in %s (raise the controller's open file limit if this repeats)", err, acceptDelay), "", "")

			select {
			case <-ctx.Done():
				return nil
			case <-time.After(acceptDelay):
			}

			continue
		}

		acceptDelay = 0
		accepted := time.Now()
		source := sourceKey(conn.RemoteAddr())

		release, refused := s.admission.admit(source)
		if refused != nil {
			s.refuse(refused, conn.RemoteAddr(), "")
			conn.Close() //nolint:errcheck

			continue
		}

		wg.Go(func() { s.handle(ctx, conn, source, accepted, release) })
	}
}

// followRevocations ends the session of a site revoked or deleted anywhere, not only through this process's
// admin socket: with the registry in Omni, a standby controller's admin socket or another tool writes it. The
// site's record is checked as a new session's would be; only a definite answer (revoked, no such site) ends
// a session, never an unreachable store.
func (s *Server) followRevocations(ctx context.Context) {
	const retry = 5 * time.Second

	for {
		err := s.opts.Registry.Watch(ctx, func(siteID string) {
			live := s.table.get(siteID)
			if live == nil {
				return
			}

			err := s.opts.Registry.Authorize(ctx, siteID, live.certSerial)
			if errors.Is(err, ErrRevoked) || errors.Is(err, ErrUnknownSite) {
				s.log.Info("site revoked or deleted: ending its session", zap.String("site", siteID), zap.Error(err))
				live.peer.Close()
			}
		})
		if ctx.Err() != nil {
			return
		}

		s.log.Warn("cannot follow site revocations (retrying)", zap.Error(err), zap.Duration("retry_in", retry))

		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// temporaryAcceptError reports whether an accept error will likely pass: out of file descriptors or memory,
// or a connection aborted before it was accepted.
func temporaryAcceptError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED)
}

// housekeep writes the counted refusals every log interval and forgets idle sources.
func (s *Server) housekeep(ctx context.Context) {
	ticker := time.NewTicker(s.opts.Limits.RejectLogInterval)
	defer ticker.Stop()

	for {
		select {
		case <-ctx.Done():
			s.rejects.flush()

			return
		case <-ticker.C:
			s.rejects.flush()
			s.admission.sweep()
		}
	}
}

// refuse counts and logs a refused connection.
func (s *Server) refuse(r *rejection, remote net.Addr, siteID string) {
	s.metrics.rejected.WithLabelValues(r.metric).Inc()

	level, msg := zapcore.WarnLevel, "uplink connection rejected"

	switch r.metric {
	case reasonTLS, reasonTLSTimeout, reasonBadMagic:
		// Port scanners and stray clients: worth a line, not a warning.
		level, msg = zapcore.InfoLevel, "uplink TLS handshake failed"
	case reasonOverload, reasonSourceHandshakes, reasonSourceRate, reasonSourcesFull:
		msg = "uplink connection refused before TLS"
	}

	addr := ""
	if remote != nil {
		addr = remote.String()
	}

	s.rejects.reject(level, msg, r.metric, r.reason, addr, siteID)
}

// Conn returns a connection to the edge of a site, or ErrSiteOffline.
func (s *Server) Conn(siteID string) (grpc.ClientConnInterface, error) {
	if live := s.table.get(siteID); live != nil {
		return live.peer.Conn(), nil
	}

	return nil, fmt.Errorf("site %s: %w", siteID, ErrSiteOffline)
}

// Connected reports whether the site has a live session.
func (s *Server) Connected(siteID string) bool {
	return s.table.get(siteID) != nil
}

// Disconnect ends the site's session, if any (after a revocation).
func (s *Server) Disconnect(siteID string) {
	if live := s.table.get(siteID); live != nil {
		live.peer.Close()
	}
}

// handle runs one connection from TLS handshake to the end of its session. release ends its handshake count.
func (s *Server) handle(ctx context.Context, raw net.Conn, source string, accepted time.Time, release func()) {
	defer release()

	log := s.log.With(zap.Stringer("remote", raw.RemoteAddr()))
	conn := tls.Server(raw, s.tlsConfig)

	defer conn.Close() //nolint:errcheck

	// Deadlines are wall-clock times on the socket (not the injected clock, which only dates certificates).
	raw.SetDeadline(accepted.Add(s.opts.Limits.TLSTimeout)) //nolint:errcheck

	if err := conn.HandshakeContext(ctx); err != nil {
		r := &rejection{metric: reasonTLS, reason: err.Error()}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			r = &rejection{metric: reasonTLSTimeout, reason: fmt.Sprintf("TLS handshake not completed within %s of connecting (--uplink-tls-timeout): %v", s.opts.Limits.TLSTimeout, err)}
		}

		if ctx.Err() == nil {
			s.refuse(r, raw.RemoteAddr(), "")
		}

		return
	}

	conn.SetDeadline(accepted.Add(s.opts.Limits.HandshakeTimeout)) //nolint:errcheck

	hello, reject := s.readHello(conn)

	var releaseEnroll func()

	if reject == nil {
		if hello.GetPurpose() == uplinkpb.Hello_PURPOSE_ENROLL {
			releaseEnroll, reject = s.admitEnroll(ctx, source, hello)
		} else {
			reject = s.check(ctx, conn, hello)
		}
	}

	if reject == nil {
		// The release is judged once the hello is authenticated (certificate or join token), so that what is
		// remembered per site came from that site's edge.
		if reject = s.checkRelease(hello, log); reject != nil && releaseEnroll != nil {
			releaseEnroll()
			releaseEnroll = nil
		}
	}

	if reject != nil {
		s.admission.penalize(source)
		s.refuse(reject, raw.RemoteAddr(), hello.GetSiteId())

		if reject.reply {
			s.reply(conn, reject.code, reject.reason, reject.retryAfter) //nolint:errcheck // the peer may be gone; it was logged
		}

		return
	}

	if releaseEnroll != nil {
		defer releaseEnroll()
	}

	if err := s.reply(conn, uplinkpb.HelloReply_CODE_ACCEPTED, "", 0); err != nil {
		log.Info("uplink hello reply failed", zap.Error(err))

		return
	}

	conn.SetDeadline(time.Time{}) //nolint:errcheck
	release()

	switch hello.GetPurpose() {
	case uplinkpb.Hello_PURPOSE_ENROLL:
		s.serveEnroll(ctx, conn, source, hello, log)
	default:
		s.serveSession(ctx, conn, hello, log)
	}
}

type rejection struct {
	code   uplinkpb.HelloReply_Code
	reason string
	metric string
	reply  bool
	// retryAfter is what the edge is asked to wait before trying again; zero says nothing.
	retryAfter time.Duration
}

func (s *Server) readHello(conn *tls.Conn) (*uplinkpb.Hello, *rejection) {
	frame, err := uplink.ReadFrame(conn)
	if err != nil {
		switch {
		case errors.Is(err, uplink.ErrBadMagic):
			return nil, &rejection{code: uplinkpb.HelloReply_CODE_MALFORMED, reason: err.Error(), metric: reasonBadMagic}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, &rejection{
				metric: reasonHelloTimeout,
				reason: fmt.Sprintf("no hello within %s of connecting (--uplink-handshake-timeout): %v", s.opts.Limits.HandshakeTimeout, err),
			}
		}

		return nil, &rejection{code: uplinkpb.HelloReply_CODE_MALFORMED, reason: err.Error(), metric: reasonMalformed, reply: true}
	}

	if frame.ProtocolVersion != version.ProtocolVersion {
		return nil, &rejection{
			code: uplinkpb.HelloReply_CODE_PROTOCOL_VERSION,
			reason: fmt.Sprintf("the edge speaks uplink protocol %d, this controller (%s) speaks %d: run the same release on both",
				frame.ProtocolVersion, s.opts.Version, version.ProtocolVersion),
			metric: reasonProtocolVersion,
			reply:  true,
		}
	}

	hello, err := uplink.DecodeHello(frame.Payload)
	if err != nil {
		return nil, &rejection{code: uplinkpb.HelloReply_CODE_MALFORMED, reason: err.Error(), metric: reasonMalformed, reply: true}
	}

	return hello, nil
}

// admitEnroll decides whether an ENROLL hello gets an enrolment session: its source and site are not locked
// out, its join token is the site's current one, and there is room. Nothing is signed here, and a connection
// without a valid token never holds a session. The returned release ends the session's count.
func (s *Server) admitEnroll(ctx context.Context, source string, hello *uplinkpb.Hello) (func(), *rejection) {
	siteID := hello.GetSiteId()

	if hello.GetJoinToken() == "" {
		return nil, &rejection{
			code: uplinkpb.HelloReply_CODE_MALFORMED,
			reason: fmt.Sprintf("the enrolment hello carries no join token (an edge older than this controller, %s?): run the same release on both",
				s.opts.Version),
			metric: reasonNoToken,
			reply:  true,
		}
	}

	if r := s.admission.enrollLockout(source, siteID); r != nil {
		return nil, r
	}

	if r := s.checkToken(ctx, source, siteID, hello.GetJoinToken()); r != nil {
		return nil, r
	}

	return s.admission.acquireEnroll(source, siteID)
}

// checkToken checks a join token for the site a connection names, counting a wrong one against its source
// (and its site, when the site exists) and refusing with the reason the edge and the operator act on.
func (s *Server) checkToken(ctx context.Context, source, siteID, text string) *rejection {
	tokenRejected := func(reason string, countSite bool) *rejection {
		s.tokenFailed(source, siteID, countSite)

		return &rejection{code: uplinkpb.HelloReply_CODE_TOKEN_REJECTED, reason: reason, metric: reasonTokenRejected, reply: true}
	}

	tok, err := uplink.ParseJoinToken(text)
	if err != nil {
		return tokenRejected(err.Error(), false)
	}

	if tok.SiteID != siteID {
		return tokenRejected(fmt.Sprintf("the join token is for site %q but the hello names site %q", tok.SiteID, siteID), false)
	}

	if tok.CAFingerprint != s.opts.CA.Fingerprint() {
		return tokenRejected("the join token was issued by another controller (CA fingerprint differs)", false)
	}

	err = s.opts.Registry.CheckToken(ctx, tok)

	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrTokenRejected):
		return tokenRejected(err.Error()+"; get a new one with `controller site token "+siteID+"`", true)
	case errors.Is(err, ErrTokenExpired), errors.Is(err, ErrTokenUsed):
		// The secret is right: nobody is guessing, nothing to count.
		return &rejection{code: uplinkpb.HelloReply_CODE_TOKEN_REJECTED, reason: err.Error() + "; get a new one with `controller site token " + siteID + "`", metric: reasonTokenRejected, reply: true}
	case errors.Is(err, ErrUnknownSite):
		s.tokenFailed(source, siteID, false)

		return &rejection{code: uplinkpb.HelloReply_CODE_UNKNOWN_SITE, reason: err.Error() + " (deleted? create it again and use its new token)", metric: reasonUnknownSite, reply: true}
	case errors.Is(err, ErrRevoked):
		return &rejection{code: uplinkpb.HelloReply_CODE_REVOKED, reason: err.Error(), metric: reasonRevoked, reply: true}
	default:
		return &rejection{code: uplinkpb.HelloReply_CODE_OVERLOADED, reason: "check join token: " + err.Error(), metric: reasonInternal, reply: true, retryAfter: s.opts.Limits.RetryAfter}
	}
}

// tokenFailed counts a wrong join token and logs the lockouts it starts.
func (s *Server) tokenFailed(source, siteID string, countSite bool) {
	started := s.admission.tokenFailed(source, siteID, countSite)
	lim := s.opts.Limits

	if started.source {
		s.metrics.lockouts.WithLabelValues("source").Inc()
		s.rejects.reject(zapcore.WarnLevel, "uplink enrolment locked out", "source_lockout_started", fmt.Sprintf(
			"%d wrong join tokens from %s within %s: enrolment from this address is refused for %s (--uplink-token-lockout); "+
				"an edge there with a good token retries by itself after that", lim.SourceTokenFailures, source, lim.TokenFailureWindow, lim.SourceLockout), source, siteID)
	}

	if started.site {
		s.metrics.lockouts.WithLabelValues("site").Inc()
		s.rejects.reject(zapcore.WarnLevel, "uplink enrolment locked out", "site_lockout_started", fmt.Sprintf(
			"%d wrong join tokens for site %q within %s (someone may be guessing; the last from %s): its enrolment is paused for %s; "+
				"enrolled edges are not affected", lim.SiteTokenFailures, siteID, lim.TokenFailureWindow, source, lim.SiteLockout), source, siteID)
	}
}

// check authenticates a session hello against the client certificate and the registry.
func (s *Server) check(ctx context.Context, conn *tls.Conn, hello *uplinkpb.Hello) *rejection {
	leaf, err := s.opts.CA.VerifyClient(conn.ConnectionState().PeerCertificates, s.opts.Now())
	if err != nil {
		return &rejection{code: uplinkpb.HelloReply_CODE_BAD_CERTIFICATE, reason: fmt.Sprintf("%v (is it from this controller's CA? re-enrol with a new join token)", err), metric: reasonBadCertificate, reply: true}
	}

	certSite := leaf.Subject.CommonName
	if certSite != hello.GetSiteId() {
		return &rejection{
			code:   uplinkpb.HelloReply_CODE_SITE_MISMATCH,
			reason: fmt.Sprintf("the client certificate is for site %q but the hello names site %q", certSite, hello.GetSiteId()),
			metric: reasonSiteMismatch,
			reply:  true,
		}
	}

	if err := s.opts.Registry.Authorize(ctx, certSite, leaf.SerialNumber.String()); err != nil {
		switch {
		case errors.Is(err, ErrUnknownSite):
			return &rejection{code: uplinkpb.HelloReply_CODE_UNKNOWN_SITE, reason: fmt.Sprintf("site %q does not exist on this controller (deleted?)", certSite), metric: reasonUnknownSite, reply: true}
		case errors.Is(err, ErrRevoked):
			return &rejection{code: uplinkpb.HelloReply_CODE_REVOKED, reason: fmt.Sprintf("site %q has been revoked", certSite), metric: reasonRevoked, reply: true}
		default:
			return &rejection{code: uplinkpb.HelloReply_CODE_BAD_CERTIFICATE, reason: err.Error(), metric: reasonBadCertificate, reply: true}
		}
	}

	return nil
}

func (s *Server) reply(conn net.Conn, code uplinkpb.HelloReply_Code, reason string, retryAfter time.Duration) error {
	msg := &uplinkpb.HelloReply{
		Code:              code,
		Reason:            reason,
		ProtocolVersion:   version.ProtocolVersion,
		ControllerVersion: s.opts.Version,
	}

	if retryAfter > 0 {
		msg.RetryAfter = durationpb.New(retryAfter)
	}

	return uplink.WriteFrame(conn, version.ProtocolVersion, msg)
}

// serveEnroll serves one enrolment session: one Enroll call, within Limits.EnrollTimeout.
func (s *Server) serveEnroll(ctx context.Context, conn *tls.Conn, source string, hello *uplinkpb.Hello, log *zap.Logger) {
	sess, err := yamux.Server(conn, uplink.YamuxConfig(log))
	if err != nil {
		log.Warn("enrolment session", zap.Error(err))

		return
	}

	peer, err := uplink.NewPeer(sess)
	if err != nil {
		sess.Close() //nolint:errcheck
		log.Warn("enrolment session", zap.Error(err))

		return
	}

	ctx, cancel := context.WithTimeout(ctx, s.opts.Limits.EnrollTimeout)

	var lingering sync.WaitGroup
	defer lingering.Wait()
	defer cancel()

	svc := &enrollService{server: s, hello: hello, source: source, log: log, finished: make(chan struct{})}

	// After its one call the session lingers only for the answer to reach the edge.
	lingering.Go(func() {
		select {
		case <-ctx.Done():
		case <-svc.finished:
			linger := time.NewTimer(enrollLinger)
			defer linger.Stop()

			select {
			case <-ctx.Done():
			case <-linger.C:
				cancel()
			}
		}
	})

	srv := grpc.NewServer()
	uplinkpb.RegisterEnrollmentServer(srv, svc)

	if err := peer.Serve(ctx, srv); err != nil {
		log.Info("enrolment session ended", zap.Error(err))
	}
}

func (s *Server) serveSession(ctx context.Context, conn *tls.Conn, hello *uplinkpb.Hello, log *zap.Logger) {
	siteID := hello.GetSiteId()
	log = log.With(zap.String("site", siteID))

	sess, err := yamux.Server(conn, uplink.YamuxConfig(log))
	if err != nil {
		log.Warn("uplink session", zap.Error(err))

		return
	}

	peer, err := uplink.NewPeer(sess)
	if err != nil {
		sess.Close() //nolint:errcheck
		log.Warn("uplink session", zap.Error(err))

		return
	}

	leaf := conn.ConnectionState().PeerCertificates[0]
	live := &liveSession{
		siteID:      siteID,
		peer:        peer,
		edgeVersion: hello.GetEdgeVersion(),
		since:       s.opts.Now(),
		certExpiry:  leaf.NotAfter,
		certSerial:  leaf.SerialNumber.String(),
	}

	if old := s.table.replace(live); old != nil {
		log.Info("new session replaces the previous one", zap.Stringer("previous_remote", old.peer.RemoteAddr()))
		old.peer.Close()
	} else {
		s.metrics.connected.Inc()
	}

	s.metrics.sessions.Inc()
	s.refusals.clear(siteID)
	live.sessions = s.statuses.connected(ctx, live, log)
	log.Info("site connected", zap.String("edge_version", live.edgeVersion))

	srv := grpc.NewServer(append([]grpc.ServerOption{
		// The session is over only when every call the edge made on it has returned.
		grpc.WaitForHandlers(true),
		grpc.ChainUnaryInterceptor(siteUnaryInterceptor(siteID)),
		grpc.ChainStreamInterceptor(siteStreamInterceptor(siteID)),
	}, s.opts.ServerOptions...)...)

	uplinkpb.RegisterControllerServer(srv, &controllerService{server: s})

	for _, register := range s.opts.Register {
		register(srv)
	}

	sctx, cancel := context.WithCancel(ctx)
	eg, sctx := errgroup.WithContext(sctx)

	eg.Go(func() error { return peer.Serve(sctx, srv) })

	for _, fn := range s.opts.OnSession {
		eg.Go(func() error {
			if err := fn(sctx, siteID, peer.Conn()); err != nil && sctx.Err() == nil {
				log.Warn("session handler failed", zap.Error(err))
			}

			return nil
		})
	}

	eg.Go(func() error {
		ticker := time.NewTicker(lastSeenInterval)
		defer ticker.Stop()

		for {
			select {
			case <-sctx.Done():
				return nil
			case <-peer.Done():
				cancel()

				return nil
			case <-ticker.C:
				if s.table.get(siteID) == live {
					s.statuses.seen(sctx, siteID, log)
				}
			}
		}
	})

	if err := eg.Wait(); err != nil {
		log.Info("uplink session ended with an error", zap.Error(err))
	}

	cancel()

	if s.table.remove(live) {
		s.metrics.connected.Dec()
		// The parent context may be done (shutdown); the status must still say disconnected.
		s.statuses.disconnected(context.WithoutCancel(ctx), siteID, log)
		log.Info("site disconnected")
	}
}

// liveSession is one accepted site session.
type liveSession struct {
	siteID      string
	peer        *uplink.Peer
	edgeVersion string
	since       time.Time
	certExpiry  time.Time
	certSerial  string
	sessions    uint64
}

// sessionTable holds the one live session per site.
type sessionTable struct {
	mu     sync.Mutex
	bySite map[string]*liveSession
}

func (t *sessionTable) get(siteID string) *liveSession {
	t.mu.Lock()
	defer t.mu.Unlock()

	return t.bySite[siteID]
}

// replace makes live the site's session and returns the one it replaced, if any.
func (t *sessionTable) replace(live *liveSession) *liveSession {
	t.mu.Lock()
	defer t.mu.Unlock()

	old := t.bySite[live.siteID]
	t.bySite[live.siteID] = live

	return old
}

// remove forgets live if it is still the site's session and reports whether it was.
func (t *sessionTable) remove(live *liveSession) bool {
	t.mu.Lock()
	defer t.mu.Unlock()

	if t.bySite[live.siteID] != live {
		return false
	}

	delete(t.bySite, live.siteID)

	return true
}

// statusView returns what the controller knows of a site's connection.
func (s *Server) statusView(siteID string) (*liveSession, bool) {
	live := s.table.get(siteID)

	return live, live != nil
}
