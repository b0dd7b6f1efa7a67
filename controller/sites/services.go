package sites

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
)

type siteKey struct{}

// SiteFromContext returns the authenticated site of the edge making a call.
// It is set on every call an edge makes over its session, and only there.
func SiteFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(siteKey{}).(string)

	return id, ok
}

// WithSite returns a context carrying a site identity, for tests of services that read SiteFromContext.
func WithSite(ctx context.Context, siteID string) context.Context {
	return context.WithValue(ctx, siteKey{}, siteID)
}

func siteUnaryInterceptor(siteID string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(WithSite(ctx, siteID), req)
	}
}

func siteStreamInterceptor(siteID string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &siteStream{ServerStream: ss, ctx: WithSite(ss.Context(), siteID)})
	}
}

type siteStream struct {
	grpc.ServerStream
	ctx context.Context // a grpc.ServerStream carries its context by design
}

func (s *siteStream) Context() context.Context { return s.ctx }

// enrollService serves Enrollment on an ENROLL connection: one Enroll call, with the join token the hello
// carried (already checked when the session was given).
type enrollService struct {
	uplinkpb.UnimplementedEnrollmentServer

	server *Server
	hello  *uplinkpb.Hello
	source string
	log    *zap.Logger

	called   atomic.Bool
	finished chan struct{} // closed when the one call has returned
}

func (e *enrollService) Enroll(ctx context.Context, req *uplinkpb.EnrollRequest) (*uplinkpb.EnrollResponse, error) {
	if !e.called.CompareAndSwap(false, true) {
		return nil, status.Error(codes.FailedPrecondition, "one enrolment per connection: connect again")
	}

	defer close(e.finished)

	siteID := e.hello.GetSiteId()

	resp, err := e.enroll(ctx, req)
	if err != nil {
		e.server.metrics.enrollments.WithLabelValues(status.Code(err).String()).Inc()
		e.server.rejects.reject(zapcore.WarnLevel, "enrolment refused", "enroll_"+strings.ToLower(status.Code(err).String()),
			status.Convert(err).Message(), e.source, siteID)

		return nil, err
	}

	e.server.admission.tokenSucceeded(e.source, siteID)
	e.server.metrics.enrollments.WithLabelValues("ok").Inc()
	e.log.Info("edge enrolled", zap.String("site", siteID), zap.String("edge_version", req.GetEdgeVersion()))

	return resp, nil
}

func (e *enrollService) enroll(ctx context.Context, req *uplinkpb.EnrollRequest) (*uplinkpb.EnrollResponse, error) {
	// The session was given for the hello's token: the call must carry that one, not a next guess.
	if subtle.ConstantTimeCompare([]byte(req.GetToken()), []byte(e.hello.GetJoinToken())) != 1 {
		e.server.tokenFailed(e.source, e.hello.GetSiteId(), false)

		return nil, status.Error(codes.PermissionDenied, "the join token differs from the one in the hello")
	}

	tok, err := uplink.ParseJoinToken(req.GetToken())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	srv := e.server.opts

	// Checked again before anything is signed: the token may have been replaced or used since the hello.
	if err := srv.Registry.CheckToken(ctx, tok); err != nil {
		return nil, registryStatus(err)
	}

	// Signed before the token is used up: a bad certificate request must not burn a single-use token.
	cert, err := srv.CA.SignClient(req.GetCsr(), tok.SiteID, srv.Now(), srv.CertValidity)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	// A race lost here (two edges, one single-use token) leaves a certificate the registry never lists: it authorizes nothing.
	if err := srv.Registry.ConsumeToken(ctx, tok); err != nil {
		return nil, registryStatus(err)
	}

	if err := srv.Registry.AddCertificate(ctx, tok.SiteID, cert.SerialNumber.String()); err != nil {
		return nil, registryStatus(err)
	}

	return &uplinkpb.EnrollResponse{Certificate: cert.Raw, Ca: srv.CA.Certificate().Raw}, nil
}

// registryStatus maps registry errors to gRPC status codes with the registry's message.
func registryStatus(err error) error {
	switch {
	case errors.Is(err, ErrUnknownSite):
		return status.Error(codes.NotFound, err.Error()+" (deleted? create it again and use its new token)")
	case errors.Is(err, ErrRevoked):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, ErrTokenRejected), errors.Is(err, ErrTokenExpired), errors.Is(err, ErrTokenUsed):
		return status.Error(codes.PermissionDenied, err.Error()+"; get a new one with `controller site token <site>`")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

// controllerService serves uplink.Controller on site sessions.
type controllerService struct {
	uplinkpb.UnimplementedControllerServer

	server *Server
}

func (c *controllerService) Status(ctx context.Context, _ *uplinkpb.ControllerStatusRequest) (*uplinkpb.ControllerStatus, error) {
	siteID, ok := SiteFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no site identity")
	}

	out := &uplinkpb.ControllerStatus{SiteId: siteID, ControllerVersion: c.server.opts.Version}

	if live, ok := c.server.statusView(siteID); ok {
		out.ConnectedSince = timestamppb.New(live.since)
		out.CertificateNotAfter = timestamppb.New(live.certExpiry)
		out.RemoteAddress = live.peer.RemoteAddr().String()
		out.Sessions = live.sessions
	}

	st, err := Status(ctx, c.server.opts.Statuses, siteID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	out.LastSeen = st.TypedSpec().Value.GetLastSeen()

	return out, nil
}

func (c *controllerService) RenewCertificate(ctx context.Context, req *uplinkpb.RenewCertificateRequest) (*uplinkpb.RenewCertificateResponse, error) {
	siteID, ok := SiteFromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no site identity")
	}

	cert, err := c.server.opts.CA.SignClient(req.GetCsr(), siteID, c.server.opts.Now(), c.server.opts.CertValidity)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("renew certificate of site %s: %v", siteID, err))
	}

	if err := c.server.opts.Registry.AddCertificate(ctx, siteID, cert.SerialNumber.String()); err != nil {
		return nil, registryStatus(err)
	}

	c.server.log.Info("certificate renewed", zap.String("site", siteID), zap.Time("not_after", cert.NotAfter.Truncate(time.Second)))

	return &uplinkpb.RenewCertificateResponse{Certificate: cert.Raw, Ca: c.server.opts.CA.Certificate().Raw}, nil
}
