// Package uplink is the edge's side of the uplink: enrolment with a join token, the identity kept in the
// state directory, and the one outbound mutual-TLS connection to the controller, kept up with jittered
// exponential backoff, carrying gRPC both ways over yamux.
package uplink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
	"github.com/outpost-metal/outpost/shared/version"
)

// Config is the uplink's configuration.
type Config struct {
	// ControllerAddress is the controller's uplink address, host:port, or several separated by commas: an
	// active controller and its standbys (only the one holding the lease listens). Each attempt dials them in
	// turn, starting with the one that answered last, until one connects.
	ControllerAddress string
	// StateDir holds the edge's key, certificate and the controller's CA.
	StateDir string
	// JoinToken enrols the edge when the state directory holds no identity yet.
	JoinToken string
	// DialTimeout bounds TCP connect plus TLS plus hello.
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential wait between connection attempts: the first wait,
	// right after a session ends or an attempt fails, is drawn from [BackoffMin, 2*BackoffMin], each next from
	// a range twice as high, up to [BackoffMax/2, BackoffMax]. A controller's "retry after" is honoured on top.
	BackoffMin time.Duration
	BackoffMax time.Duration
}

// maxControllerAddresses bounds the addresses one attempt dials (an active controller and its standbys).
const maxControllerAddresses = 8

// Addresses returns the controller addresses, in the order given (see ControllerAddress); more than
// maxControllerAddresses make Validate fail.
func (c Config) Addresses() []string {
	var out []string

	for a := range strings.SplitSeq(c.ControllerAddress, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}

	return out
}

// Default returns the default uplink configuration.
func Default() Config {
	return Config{
		DialTimeout: 10 * time.Second,
		BackoffMin:  500 * time.Millisecond,
		BackoffMax:  time.Minute,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	addrs := c.Addresses()
	if len(addrs) == 0 {
		return errors.New("controller address is required (host:port)")
	}

	if len(addrs) > maxControllerAddresses {
		return fmt.Errorf("%d controller addresses: at most %d", len(addrs), maxControllerAddresses)
	}

	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return fmt.Errorf("controller address %q is not host:port", a)
		}
	}

	if c.StateDir == "" {
		return errors.New("state directory is required")
	}

	if c.JoinToken != "" {
		if _, err := uplink.ParseJoinToken(c.JoinToken); err != nil {
			return fmt.Errorf("join token: %w", err)
		}
	}

	if c.DialTimeout <= 0 || c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin {
		return errors.New("dial timeout and backoff must be positive, backoff max at least backoff min")
	}

	return nil
}

// SessionFunc runs for the life of each session. conn reaches the controller's services; ctx ends with the session.
type SessionFunc func(ctx context.Context, conn grpc.ClientConnInterface) error

// Options are the uplink's collaborators.
type Options struct {
	Logger *zap.Logger
	// Register adds the services the edge serves to the controller, on every session.
	Register []func(grpc.ServiceRegistrar)
	// ServerOptions are added to the gRPC server of every session (e.g. an unknown-service handler).
	ServerOptions []grpc.ServerOption
	// OnSession functions run for the life of each session.
	OnSession []SessionFunc
	// Counters are reported by the Edge.Status RPC.
	Counters func() map[string]int64
	// Now is the clock (certificate renewal); nil means time.Now.
	Now func() time.Time
	// Dial opens the TCP connection; nil means a net.Dialer.
	Dial func(ctx context.Context, address string) (net.Conn, error)
	// Version is the release the edge reports in its hello, which the controller holds it to; empty means
	// version.String(), the build's own.
	Version string
}

// RejectedError is the controller's refusal of a hello, with its reason.
type RejectedError struct {
	Code              uplinkpb.HelloReply_Code
	Reason            string
	ControllerVersion string
	ProtocolVersion   uint32
	// RetryAfter is how long the controller asked the edge to wait (overloaded, locked out); zero when it did not say.
	RetryAfter time.Duration
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("controller %s (uplink protocol %d) rejected the connection: %s", e.ControllerVersion, e.ProtocolVersion, e.Reason)
}

// maxRetryAfter caps the wait a controller can ask for, so that a wrong answer cannot park an edge for good.
const maxRetryAfter = time.Hour

// EnrollError is a permanent enrolment failure: retrying with the same token cannot succeed.
type EnrollError struct{ err error }

func (e *EnrollError) Error() string { return "enrol with join token: " + e.err.Error() }
func (e *EnrollError) Unwrap() error { return e.err }

// Client keeps the edge's uplink up.
type Client struct {
	cfg     Config
	opts    Options
	log     *zap.Logger
	started time.Time

	mu       sync.Mutex
	identity *Identity

	sessions  atomic.Int64
	connected atomic.Bool
	// sessionUp is when the last session came up (zero: none since the loop last looked); the run loop's
	// goroutine alone writes and reads it.
	sessionUp time.Time
	// answered is the index in Addresses of the controller that connected last; current is its address
	// (for logs and status).
	answered atomic.Int32
}

// New returns a client; Run connects.
func New(cfg Config, opts Options) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("uplink config: %w", err)
	}

	if opts.Logger == nil {
		return nil, errors.New("uplink: logger is required")
	}

	if opts.Now == nil {
		opts.Now = time.Now
	}

	if opts.Version == "" {
		opts.Version = version.String()
	}

	if opts.Dial == nil {
		d := &net.Dialer{KeepAlive: 15 * time.Second}
		opts.Dial = func(ctx context.Context, address string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", address)
		}
	}

	return &Client{cfg: cfg, opts: opts, log: opts.Logger.With(zap.String("component", "uplink")), started: opts.Now()}, nil
}

// Connected reports whether a session is up.
func (c *Client) Connected() bool { return c.connected.Load() }

// SiteID returns the edge's site once enrolled, else "".
func (c *Client) SiteID() string {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.identity == nil {
		return ""
	}

	return c.identity.SiteID
}

// Run enrols if needed, then keeps a session up until ctx is done. It returns an error only for what
// retrying cannot fix: no identity and no token, or a join token the controller refuses.
func (c *Client) Run(ctx context.Context) error {
	if err := c.ensureIdentity(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}

		return err
	}

	pace := &pacer{bo: newBackoff(c.cfg.BackoffMin, c.cfg.BackoffMax)}

	for {
		began := time.Now()
		c.sessionUp = time.Time{}
		err := c.runSession(ctx)

		if ctx.Err() != nil {
			return nil
		}

		wait := pace.after(began, c.sessionUp, time.Now())

		var rejected *RejectedError

		switch {
		case errors.As(err, &rejected) && rejected.RetryAfter > 0:
			wait = honourRetryAfter(wait, rejected.RetryAfter)
			c.log.Warn("uplink rejected", zap.String("reason", rejected.Reason), zap.Stringer("code", rejected.Code), zap.Duration("retry_in", wait))
		case rejected != nil && rejected.Code == uplinkpb.HelloReply_CODE_EDGE_VERSION:
			c.logReleaseRefused(rejected, wait)
		case rejected != nil:
			c.log.Error("uplink rejected", zap.String("reason", rejected.Reason), zap.Stringer("code", rejected.Code), zap.Duration("retry_in", wait))
		default:
			c.log.Warn("uplink down", zap.Error(err), zap.Duration("retry_in", wait))
		}

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// logReleaseRefused says that the controller refused this edge's release, which only an upgrade (of the
// edge's appliance or of the controller, as the reason says) fixes; the edge keeps trying meanwhile.
func (c *Client) logReleaseRefused(rejected *RejectedError, wait time.Duration) {
	c.log.Error("uplink rejected: the controller does not accept this edge's release", zap.String("reason", rejected.Reason),
		zap.String("edge_version", c.opts.Version), zap.String("controller_version", rejected.ControllerVersion), zap.Duration("retry_in", wait))
}

func (c *Client) ensureIdentity(ctx context.Context) error {
	id, err := LoadIdentity(c.cfg.StateDir)
	if err == nil {
		c.setIdentity(id)
		c.log.Info("edge identity loaded", zap.String("site", id.SiteID), zap.Time("certificate_not_after", id.Cert.Leaf.NotAfter))

		return nil
	}

	if !errors.Is(err, ErrNoIdentity) {
		return err
	}

	if c.cfg.JoinToken == "" {
		return fmt.Errorf("%w: give a join token (created with `controller site create`)", ErrNoIdentity)
	}

	tok, err := uplink.ParseJoinToken(c.cfg.JoinToken)
	if err != nil {
		return &EnrollError{err: err}
	}

	bo := newBackoff(c.cfg.BackoffMin, c.cfg.BackoffMax)

	for {
		id, err := c.enroll(ctx, tok)
		if err == nil {
			c.setIdentity(id)
			c.log.Info("edge enrolled", zap.String("site", id.SiteID), zap.Time("certificate_not_after", id.Cert.Leaf.NotAfter))

			return nil
		}

		var permanent *EnrollError
		if errors.As(err, &permanent) {
			return err
		}

		wait := bo.next()

		var rejected *RejectedError
		if errors.As(err, &rejected) {
			wait = honourRetryAfter(wait, rejected.RetryAfter)
		}

		if rejected != nil && rejected.Code == uplinkpb.HelloReply_CODE_EDGE_VERSION {
			c.logReleaseRefused(rejected, wait)
		} else {
			c.log.Warn("enrolment failed; retrying", zap.Error(err), zap.Duration("retry_in", wait))
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (c *Client) setIdentity(id *Identity) {
	c.mu.Lock()
	c.identity = id
	c.mu.Unlock()
}

func (c *Client) currentIdentity() *Identity {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.identity
}

// enroll exchanges the join token for a certificate.
func (c *Client) enroll(ctx context.Context, tok uplink.JoinToken) (*Identity, error) {
	keyPEM, csr, err := newKeyAndCSR(tok.SiteID)
	if err != nil {
		return nil, err
	}

	hello := &uplinkpb.Hello{SiteId: tok.SiteID, EdgeVersion: c.opts.Version, Purpose: uplinkpb.Hello_PURPOSE_ENROLL, JoinToken: tok.String()}

	peer, err := c.open(ctx, uplink.EnrollTLSConfig(tok.CAFingerprint), hello)
	if err != nil {
		var rejected *RejectedError

		switch {
		case errors.Is(err, uplink.ErrPinMismatch):
			return nil, &EnrollError{err: err}
		case errors.As(err, &rejected) && permanentEnrollRejection(rejected.Code):
			return nil, &EnrollError{err: errors.New(rejected.Reason)}
		}

		return nil, err
	}
	defer peer.Close()

	cctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()

	resp, err := uplinkpb.NewEnrollmentClient(peer.Conn()).Enroll(cctx, &uplinkpb.EnrollRequest{
		Token:       tok.String(),
		Csr:         csr,
		EdgeVersion: c.opts.Version,
	})
	if err != nil {
		switch status.Code(err) {
		case codes.PermissionDenied, codes.NotFound, codes.InvalidArgument, codes.FailedPrecondition:
			return nil, &EnrollError{err: errors.New(status.Convert(err).Message())}
		default:
			return nil, fmt.Errorf("enrol: %w", err)
		}
	}

	return saveIdentity(c.cfg.StateDir, keyPEM, resp.GetCertificate(), resp.GetCa())
}

// permanentEnrollRejection reports whether an enrolment hello's rejection means the token cannot work (retrying
// with it is pointless), as opposed to "not now" (overloaded, locked out for a while, shutting down).
func permanentEnrollRejection(code uplinkpb.HelloReply_Code) bool {
	switch code {
	case uplinkpb.HelloReply_CODE_TOKEN_REJECTED, uplinkpb.HelloReply_CODE_UNKNOWN_SITE, uplinkpb.HelloReply_CODE_REVOKED,
		uplinkpb.HelloReply_CODE_MALFORMED, uplinkpb.HelloReply_CODE_SITE_MISMATCH:
		return true
	default:
		return false
	}
}

// open dials the controller, does TLS and the hello, and returns the session's peer.
func (c *Client) open(ctx context.Context, tlsConfig *tls.Config, hello *uplinkpb.Hello) (*uplink.Peer, error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()

	raw, addr, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}

	conn := tls.Client(raw, tlsConfig)

	ok := false
	defer func() {
		if !ok {
			conn.Close() //nolint:errcheck
		}
	}()

	if err := conn.HandshakeContext(dctx); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return nil, fmt.Errorf("TLS handshake with controller %s: %w (the controller closed the connection before TLS: "+
				"it may be limiting connections from this address or at once; its outpost_uplink_rejected_total says which)", addr, err)
		}

		return nil, fmt.Errorf("TLS handshake with controller %s: %w", addr, err)
	}

	deadline, _ := dctx.Deadline()
	conn.SetDeadline(deadline) //nolint:errcheck

	if err := uplink.WriteFrame(conn, version.ProtocolVersion, hello); err != nil {
		return nil, err
	}

	frame, err := uplink.ReadFrame(conn)
	if err != nil {
		return nil, fmt.Errorf("read controller hello reply: %w", err)
	}

	reply, err := uplink.DecodeHelloReply(frame.Payload)
	if err != nil {
		return nil, err
	}

	if reply.GetCode() != uplinkpb.HelloReply_CODE_ACCEPTED {
		return nil, &RejectedError{
			Code:              reply.GetCode(),
			Reason:            reply.GetReason(),
			ControllerVersion: reply.GetControllerVersion(),
			ProtocolVersion:   reply.GetProtocolVersion(),
			RetryAfter:        min(max(reply.GetRetryAfter().AsDuration(), 0), maxRetryAfter),
		}
	}

	conn.SetDeadline(time.Time{}) //nolint:errcheck

	sess, err := yamux.Client(conn, uplink.YamuxConfig(c.log))
	if err != nil {
		return nil, fmt.Errorf("start uplink session: %w", err)
	}

	peer, err := uplink.NewPeer(sess, uplink.RelayDialOptions()...)
	if err != nil {
		sess.Close() //nolint:errcheck

		return nil, err
	}

	ok = true

	return peer, nil
}

// dial connects to the first controller address that answers, starting with the one that answered last; each
// gets DialTimeout. A standby controller does not listen, so it refuses at once.
func (c *Client) dial(ctx context.Context) (net.Conn, string, error) {
	addrs := c.cfg.Addresses()
	first := int(c.answered.Load())

	var errs []error

	for i := range addrs {
		idx := (first + i) % len(addrs)

		dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
		raw, err := c.opts.Dial(dctx, addrs[idx])

		cancel()

		if err == nil {
			c.answered.Store(int32(idx)) // at most maxControllerAddresses

			return raw, addrs[idx], nil
		}

		errs = append(errs, fmt.Errorf("dial controller %s: %w", addrs[idx], err))

		if ctx.Err() != nil {
			break
		}
	}

	return nil, "", errors.Join(errs...)
}

// controllerAddress is the address of the controller that answered last.
func (c *Client) controllerAddress() string {
	addrs := c.cfg.Addresses()

	return addrs[int(c.answered.Load())%len(addrs)]
}

// runSession runs one session from dial to its end.
func (c *Client) runSession(ctx context.Context) error {
	id := c.currentIdentity()

	hello := &uplinkpb.Hello{SiteId: id.SiteID, EdgeVersion: c.opts.Version, Purpose: uplinkpb.Hello_PURPOSE_SESSION}

	peer, err := c.open(ctx, uplink.SessionTLSConfig(id.Cert, id.CA), hello)
	if err != nil {
		return err
	}

	n := c.sessions.Add(1)
	c.sessionUp = time.Now()
	c.connected.Store(true)
	defer c.connected.Store(false)

	log := c.log.With(zap.Int64("session", n))
	log.Info("uplink connected", zap.String("site", id.SiteID), zap.String("controller", c.controllerAddress()))

	// WaitForHandlers: the session is over only when every call the controller made on it has returned.
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.WaitForHandlers(true)}, c.opts.ServerOptions...)...)
	uplinkpb.RegisterEdgeServer(srv, &edgeStatus{client: c})

	for _, register := range c.opts.Register {
		register(srv)
	}

	eg, sctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return peer.Serve(sctx, srv) })
	eg.Go(func() error { return c.renewLoop(sctx, peer.Conn(), log) })

	for _, fn := range c.opts.OnSession {
		eg.Go(func() error {
			if err := fn(sctx, peer.Conn()); err != nil && sctx.Err() == nil {
				log.Warn("session handler failed", zap.Error(err))
			}

			return nil
		})
	}

	eg.Go(func() error {
		select {
		case <-sctx.Done():
		case <-peer.Done():
		}

		return errSessionEnded
	})

	err = eg.Wait()
	if errors.Is(err, errSessionEnded) {
		err = errors.New("session closed")
	}

	log.Info("uplink session ended")

	return err
}

var errSessionEnded = errors.New("session ended")

// renewLoop renews the certificate once two thirds of its lifetime have passed.
func (c *Client) renewLoop(ctx context.Context, conn grpc.ClientConnInterface, log *zap.Logger) error {
	for {
		leaf := c.currentIdentity().Cert.Leaf
		renewAt := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(max(0, renewAt.Sub(c.opts.Now()))):
		}

		if err := c.renew(ctx, conn); err != nil {
			log.Warn("certificate renewal failed; retrying in a minute", zap.Error(err))

			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Minute):
			}

			continue
		}

		log.Info("certificate renewed", zap.Time("not_after", c.currentIdentity().Cert.Leaf.NotAfter))
	}
}

func (c *Client) renew(ctx context.Context, conn grpc.ClientConnInterface) error {
	id := c.currentIdentity()

	keyPEM, csr, err := newKeyAndCSR(id.SiteID)
	if err != nil {
		return err
	}

	resp, err := uplinkpb.NewControllerClient(conn).RenewCertificate(ctx, &uplinkpb.RenewCertificateRequest{Csr: csr})
	if err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}

	newID, err := saveIdentity(c.cfg.StateDir, keyPEM, resp.GetCertificate(), resp.GetCa())
	if err != nil {
		return err
	}

	c.setIdentity(newID)

	return nil
}

// edgeStatus serves uplink.Edge.
type edgeStatus struct {
	uplinkpb.UnimplementedEdgeServer

	client *Client
}

func (e *edgeStatus) Status(context.Context, *uplinkpb.EdgeStatusRequest) (*uplinkpb.EdgeStatus, error) {
	counters := map[string]int64{"uplink_sessions": e.client.sessions.Load()}

	if e.client.opts.Counters != nil {
		for k, v := range e.client.opts.Counters() {
			counters[k] = v
		}
	}

	return &uplinkpb.EdgeStatus{
		SiteId:      e.client.SiteID(),
		EdgeVersion: e.client.opts.Version,
		StartedAt:   timestamppb.New(e.client.started),
		Now:         timestamppb.New(e.client.opts.Now()),
		Counters:    counters,
	}, nil
}

// backoff is jittered exponential backoff: each wait is drawn uniformly from the upper half of a ceiling that
// doubles from 2*min up to max, so that edges which lost their sessions at the same moment (a controller
// restart) spread their attempts from the very first one.
type backoff struct {
	min, max, ceiling time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi, ceiling: lo} }

func (b *backoff) next() time.Duration {
	hi := min(2*b.ceiling, b.max)
	lo := max(hi/2, b.min)
	b.ceiling = hi

	return lo + rand.N(hi-lo+1) // jitter, not a secret
}

func (b *backoff) reset() { b.ceiling = b.min }

// first is a wait from the first range, [min, 2*min], leaving the ceiling where it is.
func (b *backoff) first() time.Duration {
	return b.min + rand.N(b.min+1) // jitter, not a secret
}

// pacer decides the wait before each session attempt from how the last one went.
type pacer struct {
	bo         *backoff
	quickUntil time.Time
}

// after returns the wait after an attempt that began at began and ended at now; up is when its session came
// up (zero: it never did).
func (p *pacer) after(began, up, now time.Time) time.Duration {
	switch {
	case !up.IsZero() && now.Sub(up) >= stableSession:
		// A session that held ended (a controller restarted or failed over): its successor is expected
		// within seconds, so for a while every attempt comes soon, jittered, instead of backing off.
		p.bo.reset()
		p.quickUntil = now.Add(quickRetryWindow)
	case now.Sub(began) > 30*time.Second:
		p.bo.reset()
	}

	if now.Before(p.quickUntil) {
		return p.bo.first()
	}

	return p.bo.next()
}

const (
	// stableSession is how long a session must have held for its end to be taken as a controller going
	// away (a restart, a failover) rather than a controller that accepts and drops: only then do the
	// attempts come quickly.
	stableSession = 10 * time.Second
	// quickRetryWindow is how long after such an end every attempt waits only [BackoffMin, 2*BackoffMin]:
	// long enough for a standby to take the lease over and a restarted controller to come back.
	quickRetryWindow = 30 * time.Second
)

// honourRetryAfter returns the wait before the next attempt when the controller asked for retryAfter: at least
// that, plus up to half of it again, so that the edges it turned away at once do not all come back at once.
func honourRetryAfter(wait, retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		return wait
	}

	return max(wait, retryAfter+rand.N(retryAfter/2+1)) // jitter, not a secret
}
