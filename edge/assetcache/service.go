package assetcache

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Service is the EdgeAssets gRPC service the edge serves to the controller over the uplink.
type Service struct {
	assetsapi.UnimplementedEdgeAssetsServer

	fetcher *Fetcher
	store   *Store
}

// NewService returns the EdgeAssets service for a fetcher and its store.
func NewService(fetcher *Fetcher) *Service {
	return &Service{fetcher: fetcher, store: fetcher.store}
}

// Register registers the service; pass it in the uplink's Register hooks.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	assetsapi.RegisterEdgeAssetsServer(r, s)
}

// Ensure sets the policy and queues what is missing.
func (s *Service) Ensure(_ context.Context, req *assetsapi.EnsureRequest) (*assetsapi.EnsureResponse, error) {
	policy, err := PolicyFromProto(req.GetPolicy())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	refs := make([]Ref, 0, len(req.GetAssets()))
	for _, a := range req.GetAssets() {
		refs = append(refs, RefFromProto(a))
	}

	sts, err := s.fetcher.Ensure(policy, refs)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	resp := &assetsapi.EnsureResponse{}
	for _, st := range sts {
		resp.Statuses = append(resp.Statuses, statusToProto(st))
	}

	return resp, nil
}

// List lists the cached assets.
func (s *Service) List(context.Context, *assetsapi.ListRequest) (*assetsapi.ListResponse, error) {
	entries, used := s.store.List()
	resp := &assetsapi.ListResponse{BytesUsed: used, BytesCap: s.store.Cap()}

	for _, e := range entries {
		resp.Assets = append(resp.Assets, entryToProto(e))
	}

	return resp, nil
}

// Evict removes assets; needed ones are refused.
func (s *Service) Evict(_ context.Context, req *assetsapi.EvictRequest) (*assetsapi.EvictResponse, error) {
	evicted, refused, err := s.store.Evict(req.GetSha256()...)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "evict: %v", err)
	}

	resp := &assetsapi.EvictResponse{Evicted: evicted, Refused: map[string]string{}}
	for d, e := range refused {
		resp.Refused[d] = e.Error()
	}

	return resp, nil
}

// PolicyFromProto converts a protobuf policy.
func PolicyFromProto(p assetsapi.Policy) (Policy, error) {
	switch p {
	case assetsapi.Policy_POLICY_PASSTHROUGH:
		return PolicyPassthrough, nil
	case assetsapi.Policy_POLICY_CACHE:
		return PolicyCache, nil
	case assetsapi.Policy_POLICY_OFFLINE:
		return PolicyOffline, nil
	default:
		return "", errors.New("asset policy not set")
	}
}

// PolicyToProto converts a policy to protobuf.
func PolicyToProto(p Policy) assetsapi.Policy {
	switch p {
	case PolicyPassthrough:
		return assetsapi.Policy_POLICY_PASSTHROUGH
	case PolicyCache:
		return assetsapi.Policy_POLICY_CACHE
	case PolicyOffline:
		return assetsapi.Policy_POLICY_OFFLINE
	default:
		return assetsapi.Policy_POLICY_UNSPECIFIED
	}
}

// RefFromProto converts a protobuf asset reference.
func RefFromProto(a *assetsapi.AssetRef) Ref {
	return Ref{Name: a.GetName(), SHA256: a.GetSha256(), Size: a.GetSize(), URLs: a.GetUrls()}
}

func refToProto(r Ref) *assetsapi.AssetRef {
	return &assetsapi.AssetRef{Name: r.Name, Sha256: r.SHA256, Size: r.Size, Urls: r.URLs}
}

func entryToProto(e Entry) *assetsapi.AssetStatus {
	name := ""
	if len(e.Names) > 0 {
		name = e.Names[0]
	}

	st := &assetsapi.AssetStatus{
		Ref:    &assetsapi.AssetRef{Name: name, Sha256: e.SHA256, Size: e.Size},
		State:  assetsapi.AssetState_ASSET_STATE_PRESENT,
		Needed: e.Needed,
	}

	if !e.LastUsed.IsZero() {
		st.LastUsed = timestamppb.New(e.LastUsed)
	}

	return st
}

func statusToProto(s Status) *assetsapi.AssetStatus {
	st := &assetsapi.AssetStatus{Ref: refToProto(s.Ref), Error: s.Err}

	switch s.State {
	case StatePresent:
		st.State = assetsapi.AssetState_ASSET_STATE_PRESENT
	case StateFetching:
		st.State = assetsapi.AssetState_ASSET_STATE_FETCHING
	case StateMissing:
		st.State = assetsapi.AssetState_ASSET_STATE_MISSING
	case StateFailed:
		st.State = assetsapi.AssetState_ASSET_STATE_FAILED
	}

	return st
}
