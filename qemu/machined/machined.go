// Package machined is a stand-in for Talos's machined API in a lab guest, for the real Talos metal agent
// (github.com/siderolabs/talos-metal-agent) to run on: gRPC on machined's unix socket
// (constants.MachineSocketPath) serving only what the agent calls, written from Talos's machinery types:
//
//   - MachineService.Version;
//   - COSI state reads (cosi-project/runtime's protobuf state server over an in-memory state, read-only):
//     hardware.SystemInformation with the SMBIOS UUID, and a block.Disk per whole disk under /sys/block;
//   - StorageService.BlockDeviceWipe: FAST clears the first and last MiB (after a discard, as Talos's
//     go-blockdevice FastWipe does), ZEROES the whole device (BLKZEROOUT, else written zeroes);
//   - MachineService.Reboot: answered, then Serve returns a *RebootError with the mode asked for (the
//     caller reboots the guest; POWERCYCLE is a full firmware reset, which is what the lab's -no-reboot QEMU
//     turns into a new QEMU run).
//
// Roles are checked as machined checks them, from the talos-role metadata the agent injects: reads need a
// reader, Reboot an operator, BlockDeviceWipe an admin. Everything else is Unimplemented. It is test tooling.
package machined

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/api/storage"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// SocketPath is where machined serves its API in Talos (and where the agent dials it).
const SocketPath = constants.MachineSocketPath

// Config configures a Server.
type Config struct {
	// SysRoot is the sysfs mount (default "/sys"): SMBIOS from class/dmi/id, disks from block.
	SysRoot string
	// DevDir holds the disks' device nodes (default "/dev").
	DevDir string
	// Tag is the Talos version Version reports (default "v0.0.0-lab").
	Tag string
	// StopGrace bounds how long Serve waits for calls in flight once a reboot is asked (default 5 s).
	StopGrace time.Duration
	// Logger is required.
	Logger *zap.Logger
	// BeforeWipe, when set, runs before each BlockDeviceWipe call touches a device, with the call's number
	// (from 1) and context: a lab's fault injection (a Talos API that errors or hangs, an agent killed in the
	// middle of a wipe). An error ends the call with every device left as it was.
	BeforeWipe func(ctx context.Context, call int) error
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Logger == nil {
		return errors.New("logger is required")
	}

	return nil
}

// RebootError is what Serve returns once a Reboot call was answered: the guest is to reboot in Mode.
type RebootError struct {
	Mode machine.RebootRequest_Mode
}

func (e *RebootError) Error() string { return "reboot requested (" + e.Mode.String() + ")" }

// Server is the machined stand-in.
type Server struct {
	machine.UnimplementedMachineServiceServer
	storage.UnimplementedStorageServiceServer

	cfg   Config
	log   *zap.Logger
	state state.State
	disks map[string]Disk

	wipeMu    sync.Mutex
	wipeCalls int

	reboot chan machine.RebootRequest_Mode
}

// New reads the machine's SMBIOS identity and disks from SysRoot and returns a Server holding them as COSI
// resources.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("machined stand-in config: %w", err)
	}

	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}

	if cfg.DevDir == "" {
		cfg.DevDir = "/dev"
	}

	if cfg.Tag == "" {
		cfg.Tag = "v0.0.0-lab"
	}

	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}

	s := &Server{
		cfg: cfg, log: cfg.Logger.With(zap.String("component", "machined")),
		state:  state.WrapCore(namespaced.NewState(inmem.Build)),
		disks:  map[string]Disk{},
		reboot: make(chan machine.RebootRequest_Mode, 1),
	}

	ctx := context.Background()

	sysInfo, err := ReadSystemInformation(cfg.SysRoot)
	if err != nil {
		return nil, err
	}

	if err := s.state.Create(ctx, sysInfo); err != nil {
		return nil, fmt.Errorf("store system information: %w", err)
	}

	disks, err := ReadDisks(cfg.SysRoot, cfg.DevDir)
	if err != nil {
		return nil, err
	}

	for _, d := range disks {
		if err := s.state.Create(ctx, d.Resource()); err != nil {
			return nil, fmt.Errorf("store disk %s: %w", d.Name, err)
		}

		s.disks[d.Name] = d
	}

	return s, nil
}

// Serve answers on ln until ctx ends (then nil) or a Reboot call was answered (then a *RebootError). It
// closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.authorizeUnary), grpc.ChainStreamInterceptor(s.authorizeStream))

	machine.RegisterMachineServiceServer(srv, s)
	storage.RegisterStorageServiceServer(srv, s)
	cosiv1alpha1.RegisterStateServer(srv, server.NewState(state.Filter(s.state, readOnly)))

	errc := make(chan error, 1)

	go func() { errc <- srv.Serve(ln) }()

	select {
	case <-ctx.Done():
		srv.Stop()

		return <-errc // nil once stopped
	case err := <-errc:
		return fmt.Errorf("serve machined api: %w", err)
	case mode := <-s.reboot:
		s.stop(srv)

		if err := <-errc; err != nil {
			return fmt.Errorf("serve machined api: %w", err)
		}

		return &RebootError{Mode: mode}
	}
}

// stop lets the calls in flight (the Reboot answer among them) finish, within StopGrace.
func (s *Server) stop(srv *grpc.Server) {
	done := make(chan struct{})

	go func() { srv.GracefulStop(); close(done) }()

	select {
	case <-done:
	case <-time.After(s.cfg.StopGrace):
		srv.Stop()
		<-done
	}
}

// readOnly refuses every COSI write: the agent only reads, and the resources stand for the hardware.
func readOnly(_ context.Context, access state.Access) error {
	if access.Verb != state.Get && access.Verb != state.List && access.Verb != state.Watch {
		return status.Error(codes.PermissionDenied, "the machined stand-in's state is read-only")
	}

	return nil
}

// required is the roles any of which a method needs (machined's authorization rules for these methods).
func required(method string) role.Set {
	switch method {
	case machine.MachineService_Reboot_FullMethodName:
		return role.MakeSet(role.Admin, role.Operator)
	case storage.StorageService_BlockDeviceWipe_FullMethodName:
		return role.MakeSet(role.Admin)
	default:
		return role.MakeSet(role.Admin, role.Operator, role.Reader)
	}
}

func authorize(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)

	roles, _ := role.Parse(md.Get(constants.APIAuthzRoleMetadataKey))
	if !roles.IncludesAny(required(method)) {
		return status.Errorf(codes.PermissionDenied, "not authorized: %s needs one of %v", method, required(method).Strings())
	}

	return nil
}

func (s *Server) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := authorize(ctx, info.FullMethod); err != nil {
		s.log.Warn("call refused", zap.String("method", info.FullMethod), zap.Error(err))

		return nil, err
	}

	return handler(ctx, req)
}

func (s *Server) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := authorize(ss.Context(), info.FullMethod); err != nil {
		s.log.Warn("call refused", zap.String("method", info.FullMethod), zap.Error(err))

		return err
	}

	return handler(srv, ss)
}

// Version implements machine.MachineServiceServer.
func (s *Server) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return &machine.VersionResponse{Messages: []*machine.Version{{
		Version:  &machine.VersionInfo{Tag: s.cfg.Tag, Os: "linux", Arch: "amd64"},
		Platform: &machine.PlatformInfo{Name: "metal", Mode: "metal"},
	}}}, nil
}

// Reboot implements machine.MachineServiceServer: it answers, and Serve then returns a *RebootError.
func (s *Server) Reboot(_ context.Context, req *machine.RebootRequest) (*machine.RebootResponse, error) {
	s.log.Info("reboot requested", zap.Stringer("mode", req.GetMode()))

	select {
	case s.reboot <- req.GetMode():
	default: // one is already on its way
	}

	return &machine.RebootResponse{Messages: []*machine.Reboot{{}}}, nil
}

// BlockDeviceWipe implements storage.StorageServiceServer. Every device is checked before any is touched;
// devices are wiped one after the other, and the first failure ends the call with the rest left alone.
func (s *Server) BlockDeviceWipe(ctx context.Context, req *storage.BlockDeviceWipeRequest) (*storage.BlockDeviceWipeResponse, error) {
	if len(req.GetDevices()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no devices to wipe")
	}

	for _, d := range req.GetDevices() {
		disk, ok := s.disks[d.GetDevice()]
		if !ok || filepath.Base(d.GetDevice()) != d.GetDevice() {
			return nil, status.Errorf(codes.NotFound, "blockdevice %q not found", d.GetDevice())
		}

		if disk.Readonly {
			return nil, status.Errorf(codes.FailedPrecondition, "blockdevice %q is read-only", d.GetDevice())
		}

		if d.GetMethod() != storage.BlockDeviceWipeDescriptor_FAST && d.GetMethod() != storage.BlockDeviceWipeDescriptor_ZEROES {
			return nil, status.Errorf(codes.InvalidArgument, "unsupported wipe method %s", d.GetMethod())
		}
	}

	s.wipeMu.Lock()
	defer s.wipeMu.Unlock()

	s.wipeCalls++

	if s.cfg.BeforeWipe != nil {
		if err := s.cfg.BeforeWipe(ctx, s.wipeCalls); err != nil {
			s.log.Warn("wipe refused before it started", zap.Int("call", s.wipeCalls), zap.Error(err))

			return nil, status.Errorf(codes.Unavailable, "wipe not started: %v", err)
		}
	}

	for _, d := range req.GetDevices() {
		disk := s.disks[d.GetDevice()]
		start := time.Now()

		how, err := Wipe(ctx, disk.DevPath, d.GetMethod() == storage.BlockDeviceWipeDescriptor_ZEROES)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "wipe %s: %v", d.GetDevice(), err)
		}

		s.log.Info("blockdevice wiped", zap.String("device", d.GetDevice()), zap.Stringer("method", d.GetMethod()),
			zap.String("how", how), zap.Duration("elapsed", time.Since(start)))
	}

	return &storage.BlockDeviceWipeResponse{Messages: []*storage.BlockDeviceWipe{{}}}, nil
}
