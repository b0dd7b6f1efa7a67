package boot

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Service serves the BootPlans gRPC service over a Table (the edge registers it on its uplink session).
type Service struct {
	bootpb.UnimplementedBootPlansServer

	table *Table
	reach func() *bootpb.Reach
}

// NewService returns the gRPC service for table; reach says how the site's machines reach this edge (nil,
// or nil from it: not known), which every acknowledgement carries to the controller.
func NewService(table *Table, reach func() *bootpb.Reach) *Service {
	return &Service{table: table, reach: reach}
}

// Register registers the service (it fits uplink.Options.Register).
func (s *Service) Register(r grpc.ServiceRegistrar) {
	bootpb.RegisterBootPlansServer(r, s)
}

// State returns the held version.
func (s *Service) State(context.Context, *bootpb.StateRequest) (*bootpb.StateResponse, error) {
	return &bootpb.StateResponse{Version: s.table.Version()}, nil
}

// Apply applies and persists a change, then acknowledges its version.
func (s *Service) Apply(_ context.Context, req *bootpb.ApplyRequest) (*bootpb.ApplyResponse, error) {
	v, err := s.table.Apply(req)

	switch {
	case errors.Is(err, ErrVersionMismatch):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}

	resp := &bootpb.ApplyResponse{Version: v}
	if s.reach != nil {
		resp.Reach = s.reach()
	}

	return resp, nil
}
