package sites

import (
	"context"
	"errors"

	"github.com/cosi-project/runtime/pkg/state"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// Admin serves the operator API (adminpb.Admin) on the controller's local admin socket.
type Admin struct {
	adminpb.UnimplementedAdminServer

	registry *Registry
	server   *Server
	statuses state.State
}

// NewAdmin returns the operator API over a registry and the uplink server.
func NewAdmin(registry *Registry, server *Server, statuses state.State) *Admin {
	return &Admin{registry: registry, server: server, statuses: statuses}
}

// CreateSite implements adminpb.AdminServer.
func (a *Admin) CreateSite(ctx context.Context, req *adminpb.CreateSiteRequest) (*adminpb.CreateSiteResponse, error) {
	if err := uplink.ValidateSiteID(req.GetSiteId()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	tok, expires, err := a.registry.Create(ctx, req.GetSiteId(), req.GetDescription(), TokenOptions{
		TTL:      req.GetTokenTtl().AsDuration(),
		Reusable: req.GetReusable(),
	})
	if err != nil {
		if errors.Is(err, ErrSiteExists) {
			return nil, status.Error(codes.AlreadyExists, err.Error())
		}

		return nil, registryStatus(err)
	}

	return &adminpb.CreateSiteResponse{SiteId: tok.SiteID, JoinToken: tok.String(), TokenExpires: timestamppb.New(expires)}, nil
}

// NewJoinToken implements adminpb.AdminServer.
func (a *Admin) NewJoinToken(ctx context.Context, req *adminpb.NewJoinTokenRequest) (*adminpb.CreateSiteResponse, error) {
	tok, expires, err := a.registry.NewToken(ctx, req.GetSiteId(), TokenOptions{
		TTL:      req.GetTokenTtl().AsDuration(),
		Reusable: req.GetReusable(),
	})
	if err != nil {
		return nil, registryStatus(err)
	}

	return &adminpb.CreateSiteResponse{SiteId: tok.SiteID, JoinToken: tok.String(), TokenExpires: timestamppb.New(expires)}, nil
}

// ListSites implements adminpb.AdminServer.
func (a *Admin) ListSites(ctx context.Context, _ *adminpb.ListSitesRequest) (*adminpb.ListSitesResponse, error) {
	list, err := a.registry.List(ctx)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	out := &adminpb.ListSitesResponse{}

	for _, site := range list {
		spec := site.TypedSpec().Value

		st, err := Status(ctx, a.statuses, site.Metadata().ID())
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}

		live := st.TypedSpec().Value

		out.Sites = append(out.Sites, &adminpb.Site{
			SiteId:         site.Metadata().ID(),
			Description:    spec.GetDescription(),
			Revoked:        spec.GetRevoked(),
			Connected:      a.server.Connected(site.Metadata().ID()),
			EdgeVersion:    live.GetEdgeVersion(),
			LastSeen:       live.GetLastSeen(),
			ConnectedSince: live.GetConnectedSince(),
			RemoteAddress:  live.GetRemoteAddress(),
			TokenExpires:   spec.GetTokenExpires(),
			TokenUsed:      spec.GetTokenUsed(),
			Enrolled:       len(spec.GetCertificateSerials()) > 0,
		})
	}

	return out, nil
}

// RevokeSite implements adminpb.AdminServer: the site's certificates stop working and its session ends now.
func (a *Admin) RevokeSite(ctx context.Context, req *adminpb.RevokeSiteRequest) (*adminpb.RevokeSiteResponse, error) {
	if err := a.registry.Revoke(ctx, req.GetSiteId()); err != nil {
		return nil, registryStatus(err)
	}

	a.server.Disconnect(req.GetSiteId())

	return &adminpb.RevokeSiteResponse{}, nil
}

// DeleteSite implements adminpb.AdminServer.
func (a *Admin) DeleteSite(ctx context.Context, req *adminpb.DeleteSiteRequest) (*adminpb.DeleteSiteResponse, error) {
	if err := a.registry.Delete(ctx, req.GetSiteId()); err != nil {
		return nil, registryStatus(err)
	}

	a.server.Disconnect(req.GetSiteId())

	return &adminpb.DeleteSiteResponse{}, nil
}
