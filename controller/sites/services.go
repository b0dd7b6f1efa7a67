package sites

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
	"github.com/outpost-metal/outpost/shared/version"
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
	ctx context.Context //nolint:containedctx // a grpc.ServerStream carries its context by design
}

func (s *siteStream) Context() context.Context { return s.ctx }

// enrollService serves Enrollment on an ENROLL connection.
type enrollService struct {
	uplinkpb.UnimplementedEnrollmentServer

	server *Server
	hello  *uplinkpb.Hello
	log    *zap.Logger
}

func (e *enrollService) Enroll(ctx context.Context, req *uplinkpb.EnrollRequest) (*uplinkpb.EnrollResponse, error) {
	resp, err := e.enroll(ctx, req)
	if err != nil {
		e.server.metrics.enrollments.WithLabelValues(status.Code(err).String()).Inc()
		e.log.Warn("enrolment refused", zap.String("site", e.hello.GetSiteId()), zap.String("reason", status.Convert(err).Message()))

		return nil, err
	}

	e.server.metrics.enrollments.WithLabelValues("ok").Inc()
	e.log.Info("edge enrolled", zap.String("site", e.hello.GetSiteId()), zap.String("edge_version", req.GetEdgeVersion()))

	return resp, nil
}

func (e *enrollService) enroll(ctx context.Context, req *uplinkpb.EnrollRequest) (*uplinkpb.EnrollResponse, error) {
	tok, err := uplink.ParseJoinToken(req.GetToken())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if tok.SiteID != e.hello.GetSiteId() {
		return nil, status.Errorf(codes.InvalidArgument, "the join token is for site %q but the hello names site %q", tok.SiteID, e.hello.GetSiteId())
	}

	if tok.CAFingerprint != e.server.opts.CA.Fingerprint() {
		return nil, status.Error(codes.FailedPrecondition, "the join token was issued by another controller (CA fingerprint differs)")
	}

	// Sign first: a bad request must not burn a single-use token.
	cert, err := e.server.opts.CA.SignClient(req.GetCsr(), tok.SiteID, e.server.opts.Now(), e.server.opts.CertValidity)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if err := e.server.opts.Registry.ConsumeToken(ctx, tok); err != nil {
		return nil, registryStatus(err)
	}

	if err := e.server.opts.Registry.AddCertificate(ctx, tok.SiteID, cert.SerialNumber.String()); err != nil {
		return nil, registryStatus(err)
	}

	return &uplinkpb.EnrollResponse{Certificate: cert.Raw, Ca: e.server.opts.CA.Certificate().Raw}, nil
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

	out := &uplinkpb.ControllerStatus{SiteId: siteID, ControllerVersion: version.String()}

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
