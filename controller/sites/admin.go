package sites

import (
	"cmp"
	"context"
	"errors"
	"path/filepath"
	"slices"

	"github.com/cosi-project/runtime/pkg/state"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/resources"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/uplink"
)

// Admin serves the operator API (adminpb.Admin) on the controller's local admin socket.
type Admin struct {
	adminpb.UnimplementedAdminServer

	registry *Registry
	server   *Server
	statuses state.State
	assets   AssetState
	role     Role
	// checkSettings checks a site's settings before they are stored; nil takes none.
	checkSettings SettingsCheck
	staging       Staging
	bundler       Bundler
}

// AssetState is what the operator API needs of the boot-asset catalog.
type AssetState interface {
	SiteAssets(siteID string) *assetspb.SiteAssetState
}

// Role tells, when this controller stands by, which one acts and where it accepts edges (nil: it always acts).
type Role interface {
	ActingElsewhere(ctx context.Context) (holder, uplink string, elsewhere bool)
}

// AdminOption changes what NewAdmin builds.
type AdminOption func(*Admin)

// WithRole makes the admin API say when this controller stands by, naming the active one: the sessions, and
// so which sites are connected, are known only there.
func WithRole(r Role) AdminOption { return func(a *Admin) { a.role = r } }

// Staging turns a Talos install profile as an operator names it into its stored form
// ("<version>/<schematic>/<arch>"), resolving extensions to a schematic.
type Staging interface {
	StagedProfile(ctx context.Context, schematicID string, extensions []string, version, arch string) (string, error)
}

// Bundler writes what a site needs and the controller holds into a bundle directory.
type Bundler interface {
	BundleSite(siteID, dir string) (*adminpb.BundleAssetsResponse, error)
}

// WithBundler makes the admin API write asset bundles (controller assets bundle).
func WithBundler(b Bundler) AdminOption { return func(a *Admin) { a.bundler = b } }

// WithStaging makes the admin API stage install profiles at sites (controller assets stage).
func WithStaging(s Staging) AdminOption { return func(a *Admin) { a.staging = s } }

// WithSettings makes the admin API take sites' own settings, each change checked by check.
func WithSettings(check SettingsCheck) AdminOption { return func(a *Admin) { a.checkSettings = check } }

// NewAdmin returns the operator API over a registry, the uplink server and (optionally, nil) the asset catalog.
func NewAdmin(registry *Registry, server *Server, statuses state.State, assets AssetState, opts ...AdminOption) *Admin {
	a := &Admin{registry: registry, server: server, statuses: statuses, assets: assets}
	for _, o := range opts {
		o(a)
	}

	return a
}

// standby describes the active controller when this one stands by (nil when it acts).
func (a *Admin) standby(ctx context.Context) *adminpb.Standby {
	if a.role == nil {
		return nil
	}

	holder, uplink, elsewhere := a.role.ActingElsewhere(ctx)
	if !elsewhere {
		return nil
	}

	return &adminpb.Standby{ActiveHolder: holder, ActiveUplink: uplink}
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

	out := &adminpb.ListSitesResponse{Standby: a.standby(ctx)}

	for _, site := range list {
		view, err := a.view(ctx, site)
		if err != nil {
			return nil, err
		}

		out.Sites = append(out.Sites, view)
	}

	return out, nil
}

func (a *Admin) view(ctx context.Context, site *resources.Site) (*adminpb.Site, error) {
	spec := site.TypedSpec().Value

	st, err := Status(ctx, a.statuses, site.Metadata().ID())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	live := st.TypedSpec().Value

	var refusedAt *timestamppb.Timestamp

	refused, at := a.server.EdgeRefused(site.Metadata().ID())
	if refused != "" {
		refusedAt = timestamppb.New(at)
	}

	return &adminpb.Site{
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
		Labels:         spec.GetLabels(),
		Settings:       settingsView(SettingsOf(site)),
		EdgeRefused:    refused,
		EdgeRefusedAt:  refusedAt,
	}, nil
}

// ShowSite implements adminpb.AdminServer.
func (a *Admin) ShowSite(ctx context.Context, req *adminpb.ShowSiteRequest) (*adminpb.ShowSiteResponse, error) {
	site, err := a.registry.Get(ctx, req.GetSiteId())
	if err != nil {
		return nil, registryStatus(err)
	}

	view, err := a.view(ctx, site)
	if err != nil {
		return nil, err
	}

	out := &adminpb.ShowSiteResponse{Site: view, Standby: a.standby(ctx)}

	if a.assets != nil {
		out.Assets = a.assets.SiteAssets(req.GetSiteId())
	}

	return out, nil
}

// StageAssets implements adminpb.AdminServer: the profile is stored with the site, and every controller
// follows it (the acting one fetches its assets and has the site's edge hold them).
func (a *Admin) StageAssets(ctx context.Context, req *adminpb.StageAssetsRequest) (*adminpb.StageAssetsResponse, error) {
	return a.stage(ctx, req, func(list []string, profile string) []string {
		if slices.Contains(list, profile) {
			return list
		}

		return append(list, profile)
	})
}

// UnstageAssets implements adminpb.AdminServer.
func (a *Admin) UnstageAssets(ctx context.Context, req *adminpb.StageAssetsRequest) (*adminpb.StageAssetsResponse, error) {
	return a.stage(ctx, req, func(list []string, profile string) []string {
		return slices.DeleteFunc(list, func(s string) bool { return s == profile })
	})
}

func (a *Admin) stage(ctx context.Context, req *adminpb.StageAssetsRequest, change func([]string, string) []string) (*adminpb.StageAssetsResponse, error) {
	if a.staging == nil || a.assets == nil {
		return nil, status.Error(codes.Unimplemented, "this controller stages no install assets")
	}

	if (req.GetSchematicId() == "") == (len(req.GetExtensions()) == 0) {
		return nil, status.Error(codes.InvalidArgument, "name the profile by a schematic ID or by extensions, one of the two")
	}

	profile, err := a.staging.StagedProfile(ctx, req.GetSchematicId(), req.GetExtensions(), req.GetTalosVersion(), cmp.Or(req.GetArch(), "amd64"))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if _, err := a.registry.Get(ctx, req.GetSiteId()); err != nil {
		return nil, registryStatus(err)
	}

	if p := a.assets.SiteAssets(req.GetSiteId()).GetPolicy(); p == assetspb.Policy_POLICY_PASSTHROUGH {
		return nil, status.Errorf(codes.FailedPrecondition,
			"site %s has the passthrough asset policy: its machines fetch install assets themselves and its edge holds none (set cache or offline first)", req.GetSiteId())
	}

	staged, err := a.registry.SetStaged(ctx, req.GetSiteId(), func(list []string) ([]string, error) { return change(list, profile), nil })
	if err != nil {
		return nil, registryStatus(err)
	}

	return &adminpb.StageAssetsResponse{Profile: profile, Staged: staged}, nil
}

// BundleAssets implements adminpb.AdminServer.
func (a *Admin) BundleAssets(ctx context.Context, req *adminpb.BundleAssetsRequest) (*adminpb.BundleAssetsResponse, error) {
	if a.bundler == nil {
		return nil, status.Error(codes.Unimplemented, "this controller writes no asset bundles")
	}

	if !filepath.IsAbs(req.GetDir()) {
		return nil, status.Errorf(codes.InvalidArgument, "bundle directory %q: want an absolute path on the controller's host", req.GetDir())
	}

	if _, err := a.registry.Get(ctx, req.GetSiteId()); err != nil {
		return nil, registryStatus(err)
	}

	resp, err := a.bundler.BundleSite(req.GetSiteId(), req.GetDir())
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}

	return resp, nil
}

// SetAssetPolicy implements adminpb.AdminServer: the policy is stored with the site; every controller follows
// the stored settings (the acting one pushes the policy to the site's edge).
func (a *Admin) SetAssetPolicy(ctx context.Context, req *adminpb.SetAssetPolicyRequest) (*adminpb.SetAssetPolicyResponse, error) {
	if _, ok := assetspb.Policy_name[int32(req.GetPolicy())]; !ok || req.GetPolicy() == assetspb.Policy_POLICY_UNSPECIFIED {
		return nil, status.Errorf(codes.InvalidArgument, "asset policy %v is not passthrough, cache or offline", req.GetPolicy())
	}

	if a.assets == nil {
		return nil, status.Error(codes.Unimplemented, "this controller has no asset catalog")
	}

	if err := a.registry.SetAssetPolicy(ctx, req.GetSiteId(), int32(req.GetPolicy())); err != nil {
		return nil, registryStatus(err)
	}

	return &adminpb.SetAssetPolicyResponse{}, nil
}

// SetSiteLabels implements adminpb.AdminServer: every label is checked (as Omni would) before any is stored.
func (a *Admin) SetSiteLabels(ctx context.Context, req *adminpb.SetSiteLabelsRequest) (*adminpb.SetSiteLabelsResponse, error) {
	pairs := make([]string, 0, len(req.GetLabels()))
	for k, v := range req.GetLabels() {
		pairs = append(pairs, k+"="+v)
	}

	if _, err := labels.Parse(pairs); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	if err := a.registry.SetLabels(ctx, req.GetSiteId(), req.GetLabels()); err != nil {
		return nil, registryStatus(err)
	}

	return &adminpb.SetSiteLabelsResponse{}, nil
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
