package bmc

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	"github.com/outpost-metal/outpost/edge/bmc/redfish"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// Service serves the BMC gRPC API (shared/api/bmc) from a Manager. It never logs a request: they
// carry credentials.
type Service struct {
	bmcpb.UnimplementedBMCServer

	m       *Manager
	log     *zap.Logger
	watcher *Watcher
	ended   func(machineID string, at time.Time)
	images  Images
}

// WithBootEnded makes the service tell f of each machine it powered off or reset, with the time it sent the
// request, once the BMC took it: what ran on the machine is gone (the edge ends its agent tunnel).
func (s *Service) WithBootEnded(f func(machineID string, at time.Time)) *Service {
	s.ended = f

	return s
}

// WithWatcher makes the service take the controller's watch lists (Watch) for w.
func (s *Service) WithWatcher(w *Watcher) *Service {
	s.watcher = w

	return s
}

// Watch implements bmcpb.BMCServer: the BMCs the edge watches from now on.
func (s *Service) Watch(_ context.Context, req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	if s.watcher == nil {
		return nil, status.Error(codes.Unimplemented, "this edge does not watch BMCs")
	}

	return s.watcher.Serve(req)
}

// NewService returns the gRPC service for m.
func NewService(m *Manager) *Service {
	return &Service{m: m, log: m.log}
}

// Register registers the service on r (the edge's uplink server).
func (s *Service) Register(r grpc.ServiceRegistrar) {
	bmcpb.RegisterBMCServer(r, s)
}

func fromProto(t *bmcpb.Target) (Target, Credentials) {
	proto := ProtocolAuto

	switch t.GetProtocol() {
	case bmcpb.Protocol_PROTOCOL_IPMI:
		proto = ProtocolIPMI
	case bmcpb.Protocol_PROTOCOL_REDFISH:
		proto = ProtocolRedfish
	case bmcpb.Protocol_PROTOCOL_AUTO:
	}

	return Target{
			Host: t.GetHost(), IPMIPort: int(min(t.GetIpmiPort(), 1<<20)), RedfishEndpoint: t.GetRedfishEndpoint(), Protocol: proto,
		}, Credentials{
			Username: t.GetUsername(), Password: t.GetPassword(),
		}
}

// statusError maps a Manager error to a gRPC status; the text is already free of credentials and names the
// completion code, RMCP+ status or HTTP status in numbers and words.
//
//   - InvalidArgument: the request itself is unusable (no host, a bad port, no user, no boot mode).
//   - FailedPrecondition: the BMC refused the request for good (IsPermanent: a completion code such as CCh, a wrong
//     password, a Redfish 4xx). Not InvalidArgument: the request is well formed, and the same request can succeed
//     once the BMC's state, configuration or the credentials are fixed; FailedPrecondition says exactly that, and
//     that the caller must not retry until then.
//   - DeadlineExceeded: the BMC did not answer in time. Aborted: the override read back differs (the BMC took the
//     set and then reverted it; a new attempt may hold). Unavailable: anything else that may succeed when retried
//     (node busy, 5xx, a transport error). Canceled: the caller gave up.
func (s *Service) statusError(t *bmcpb.Target, err error) error {
	code := codes.Unavailable

	switch {
	case errors.Is(err, ErrInvalidTarget):
		code = codes.InvalidArgument
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case IsPermanent(err):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrTimeout):
		code = codes.DeadlineExceeded
	case errors.Is(err, ipmi.ErrReadBack), errors.Is(err, redfish.ErrReadBack):
		code = codes.Aborted
	}

	s.log.Info("bmc operation failed", zap.String("machine_id", t.GetMachineId()), zap.String("bmc", t.GetHost()),
		zap.Stringer("code", code), zap.Error(err))

	return status.Error(code, err.Error())
}

func (s *Service) power(ctx context.Context, req *bmcpb.PowerRequest, op func(*Manager, context.Context, Target, Credentials) error) (*bmcpb.PowerResponse, error) {
	t, c := fromProto(req.GetTarget())
	if err := op(s.m, ctx, t, c); err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	return &bmcpb.PowerResponse{}, nil
}

// PowerStatus implements bmcpb.BMCServer.
func (s *Service) PowerStatus(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerStatusResponse, error) {
	t, c := fromProto(req.GetTarget())

	on, err := s.m.PowerStatus(ctx, t, c)
	if err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	return &bmcpb.PowerStatusResponse{On: on}, nil
}

// PowerOn implements bmcpb.BMCServer.
func (s *Service) PowerOn(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return s.power(ctx, req, (*Manager).PowerOn)
}

// PowerOff implements bmcpb.BMCServer.
func (s *Service) PowerOff(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return s.endingBoot(ctx, req, (*Manager).PowerOff)
}

// PowerCycle implements bmcpb.BMCServer.
func (s *Service) PowerCycle(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return s.endingBoot(ctx, req, (*Manager).PowerCycle)
}

// endingBoot runs a power operation that ends the machine's running OS and, once the BMC took it, says so.
func (s *Service) endingBoot(ctx context.Context, req *bmcpb.PowerRequest, op func(*Manager, context.Context, Target, Credentials) error) (*bmcpb.PowerResponse, error) {
	at := s.m.now()

	resp, err := s.power(ctx, req, op)
	if err == nil && s.ended != nil && req.GetTarget().GetMachineId() != "" {
		s.ended(req.GetTarget().GetMachineId(), at)
	}

	return resp, err
}

// ClearBootOverride implements bmcpb.BMCServer.
func (s *Service) ClearBootOverride(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return s.power(ctx, req, (*Manager).ClearOverride)
}

// SetPXEOnce implements bmcpb.BMCServer.
func (s *Service) SetPXEOnce(ctx context.Context, req *bmcpb.SetPXEOnceRequest) (*bmcpb.PowerResponse, error) {
	fw, ok := req.GetMode().Firmware()
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "set one-time pxe boot: boot mode is required")
	}

	t, c := fromProto(req.GetTarget())
	if err := s.m.SetPXEOnce(ctx, t, c, fw); err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	return &bmcpb.PowerResponse{}, nil
}

// GetBootOverride implements bmcpb.BMCServer.
func (s *Service) GetBootOverride(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.GetBootOverrideResponse, error) {
	t, c := fromProto(req.GetTarget())

	set, pxe, fw, err := s.m.BootOverride(ctx, t, c)
	if err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	return &bmcpb.GetBootOverrideResponse{Set: set, Pxe: pxe, Mode: bmcpb.BootModeOf(fw)}, nil
}
