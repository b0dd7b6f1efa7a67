package intents

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Service serves the Intents API (shared/api/intents) from a Store.
type Service struct {
	intentspb.UnimplementedIntentsServer

	store *Store
}

// NewService returns the Intents service of s.
func NewService(s *Store) *Service { return &Service{store: s} }

// Register registers the service on r (the edge's uplink server).
func (v *Service) Register(r grpc.ServiceRegistrar) { intentspb.RegisterIntentsServer(r, v) }

// Outcome implements intentspb.IntentsServer.
func (v *Service) Outcome(_ context.Context, req *intentspb.OutcomeRequest) (*intentspb.IntentOutcome, error) {
	return v.store.Outcome(req.GetIntentId(), metal.NormalizeID(req.GetMachineId()))
}

// BMC is the edge's BMC service with its power actions (PowerOn, PowerOff, PowerCycle) carried out at most
// once per intent ID; a request without one goes straight through, as does everything else.
type BMC struct {
	bmcpb.BMCServer

	store *Store
}

// WrapBMC returns inner with its power actions deduplicated by s.
func WrapBMC(inner bmcpb.BMCServer, s *Store) *BMC { return &BMC{BMCServer: inner, store: s} }

// Register registers the service on r (the edge's uplink server).
func (b *BMC) Register(r grpc.ServiceRegistrar) { bmcpb.RegisterBMCServer(r, b) }

// PowerOn implements bmcpb.BMCServer.
func (b *BMC) PowerOn(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return b.once(ctx, bmcpb.BMC_PowerOn_FullMethodName, req, b.BMCServer.PowerOn)
}

// PowerOff implements bmcpb.BMCServer.
func (b *BMC) PowerOff(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return b.once(ctx, bmcpb.BMC_PowerOff_FullMethodName, req, b.BMCServer.PowerOff)
}

// PowerCycle implements bmcpb.BMCServer.
func (b *BMC) PowerCycle(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return b.once(ctx, bmcpb.BMC_PowerCycle_FullMethodName, req, b.BMCServer.PowerCycle)
}

func (b *BMC) once(ctx context.Context, op string, req *bmcpb.PowerRequest,
	call func(context.Context, *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error),
) (*bmcpb.PowerResponse, error) {
	if req.GetIntentId() == "" {
		return call(ctx, req)
	}

	machineID := metal.NormalizeID(req.GetTarget().GetMachineId())
	if machineID == "" {
		return nil, status.Errorf(codes.InvalidArgument, "intent %s: the target names no machine", req.GetIntentId())
	}

	raw, err := b.store.Do(ctx, req.GetIntentId(), machineID, op, func(ctx context.Context) ([]byte, error) {
		resp, err := call(ctx, req)
		if err != nil {
			return nil, err
		}

		return proto.Marshal(resp)
	})
	if err != nil {
		return nil, err
	}

	resp := &bmcpb.PowerResponse{}
	if err = proto.Unmarshal(raw, resp); err != nil {
		return nil, status.Errorf(codes.Internal, "intent %s: recorded response: %v", req.GetIntentId(), err)
	}

	return resp, nil
}
