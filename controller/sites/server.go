package sites

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

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
	Now     func() time.Time

	// Register adds controller-served services to every site session's gRPC server.
	Register []func(grpc.ServiceRegistrar)
	// ServerOptions are added to every site session's gRPC server.
	ServerOptions []grpc.ServerOption
	// OnSession functions run for the life of each site session.
	OnSession []SessionFunc

	// CertValidity is the lifetime of the client certificates issued to edges.
	CertValidity time.Duration
	// HandshakeTimeout bounds TLS plus hello for each new connection.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds connections in TLS or hello at once; more are closed and counted.
	MaxHandshakes int
	// ServerNames are extra DNS names for the server certificate (the fixed uplink name is always there).
	ServerNames []string
}

// Defaults for Options.
const (
	DefaultCertValidity     = 30 * 24 * time.Hour
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxHandshakes    = 128
	enrollSessionTimeout    = time.Minute
	lastSeenInterval        = 15 * time.Second
)

// ErrSiteOffline means the site has no live uplink session; the caller should try again later.
var ErrSiteOffline = errors.New("site offline")

// Server accepts edge connections: enrolment and authenticated site sessions.
type Server struct {
	opts      Options
	log       *zap.Logger
	metrics   *metrics
	tlsConfig *tls.Config
	slots     chan struct{}
	table     sessionTable
	statuses  *statusKeeper
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

	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}

	if opts.MaxHandshakes <= 0 {
		opts.MaxHandshakes = DefaultMaxHandshakes
	}

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

	s := &Server{
		opts:    opts,
		log:     opts.Logger.With(zap.String("component", "uplink_server")),
		metrics: m,
		tlsConfig: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{cert},
			// Client certificates are verified after the handshake, so that a certificate from another CA
			// gets a clear reject reason in the hello reply instead of a bare TLS alert.
			ClientAuth: tls.RequestClientCert,
		},
		slots:    make(chan struct{}, opts.MaxHandshakes),
		table:    sessionTable{bySite: map[string]*liveSession{}},
		statuses: &statusKeeper{w: opts.Statuses, now: opts.Now},
	}

	return s, nil
}

// Serve accepts connections on ln until ctx is done, then closes every session and returns nil.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.log.Info("uplink listening", zap.Stringer("address", ln.Addr()))

	stop := context.AfterFunc(ctx, func() { ln.Close() }) //nolint:errcheck
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()

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

			return fmt.Errorf("accept uplink connection: %w", err)
		}

		select {
		case s.slots <- struct{}{}:
		default:
			s.metrics.rejected.WithLabelValues(reasonOverload).Inc()
			s.log.Warn("too many uplink handshakes at once; connection closed", zap.Stringer("remote", conn.RemoteAddr()))
			conn.Close() //nolint:errcheck

			continue
		}

		wg.Go(func() { s.handle(ctx, conn) })
	}
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

// handle runs one connection from TLS handshake to the end of its session.
func (s *Server) handle(ctx context.Context, raw net.Conn) {
	released := false
	release := func() {
		if !released {
			released = true
			<-s.slots
		}
	}

	defer release()

	log := s.log.With(zap.Stringer("remote", raw.RemoteAddr()))
	conn := tls.Server(raw, s.tlsConfig)

	defer conn.Close() //nolint:errcheck

	hctx, cancel := context.WithTimeout(ctx, s.opts.HandshakeTimeout)
	defer cancel()

	if err := conn.HandshakeContext(hctx); err != nil {
		s.metrics.rejected.WithLabelValues(reasonTLS).Inc()
		log.Info("uplink TLS handshake failed", zap.Error(err))

		return
	}

	conn.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout)) //nolint:errcheck

	hello, reject := s.readHello(conn)
	if reject == nil {
		reject = s.check(ctx, conn, hello)
	}

	if reject != nil {
		s.metrics.rejected.WithLabelValues(reject.metric).Inc()
		log.Warn("uplink connection rejected", zap.String("site", hello.GetSiteId()), zap.String("reason", reject.reason))

		if reject.reply {
			s.reply(conn, reject.code, reject.reason) //nolint:errcheck // the peer may be gone; it was logged
		}

		return
	}

	if err := s.reply(conn, uplinkpb.HelloReply_CODE_ACCEPTED, ""); err != nil {
		log.Info("uplink hello reply failed", zap.Error(err))

		return
	}

	conn.SetDeadline(time.Time{}) //nolint:errcheck
	release()

	switch hello.GetPurpose() {
	case uplinkpb.Hello_PURPOSE_ENROLL:
		s.serveEnroll(ctx, conn, hello, log)
	default:
		s.serveSession(ctx, conn, hello, log)
	}
}

type rejection struct {
	code   uplinkpb.HelloReply_Code
	reason string
	metric string
	reply  bool
}

func (s *Server) readHello(conn *tls.Conn) (*uplinkpb.Hello, *rejection) {
	frame, err := uplink.ReadFrame(conn)
	if err != nil {
		if errors.Is(err, uplink.ErrBadMagic) {
			return nil, &rejection{code: uplinkpb.HelloReply_CODE_MALFORMED, reason: err.Error(), metric: reasonBadMagic}
		}

		return nil, &rejection{code: uplinkpb.HelloReply_CODE_MALFORMED, reason: err.Error(), metric: reasonMalformed, reply: true}
	}

	if frame.ProtocolVersion != version.ProtocolVersion {
		return nil, &rejection{
			code: uplinkpb.HelloReply_CODE_PROTOCOL_VERSION,
			reason: fmt.Sprintf("the edge speaks uplink protocol %d, this controller (%s) speaks %d: run the same release on both",
				frame.ProtocolVersion, version.String(), version.ProtocolVersion),
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

// check authenticates a session hello against the client certificate and the registry.
func (s *Server) check(ctx context.Context, conn *tls.Conn, hello *uplinkpb.Hello) *rejection {
	if hello.GetPurpose() == uplinkpb.Hello_PURPOSE_ENROLL {
		return nil
	}

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

func (s *Server) reply(conn net.Conn, code uplinkpb.HelloReply_Code, reason string) error {
	return uplink.WriteFrame(conn, version.ProtocolVersion, &uplinkpb.HelloReply{
		Code:              code,
		Reason:            reason,
		ProtocolVersion:   version.ProtocolVersion,
		ControllerVersion: version.String(),
	})
}

func (s *Server) serveEnroll(ctx context.Context, conn *tls.Conn, hello *uplinkpb.Hello, log *zap.Logger) {
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

	ctx, cancel := context.WithTimeout(ctx, enrollSessionTimeout)
	defer cancel()

	srv := grpc.NewServer()
	uplinkpb.RegisterEnrollmentServer(srv, &enrollService{server: s, hello: hello, log: log})

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
	}

	if old := s.table.replace(live); old != nil {
		log.Info("new session replaces the previous one", zap.Stringer("previous_remote", old.peer.RemoteAddr()))
		old.peer.Close()
	} else {
		s.metrics.connected.Inc()
	}

	s.metrics.sessions.Inc()
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
