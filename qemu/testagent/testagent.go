// Package testagent is a stand-in for the Talos metal agent: it dials an edge's tunnel endpoint,
// opens the reverse gRPC tunnel with machine-id metadata and serves the real management.AgentService
// against injectable hardware (disks as files, an IPMI user table). It is dependency-light so it can
// also run as the static /init of a lab VM.
package testagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MachineIDKey is the tunnel metadata key the real agent sends (constants.MachineIDMetadataKey).
const MachineIDKey = "machine-id"

// Config configures an Agent.
type Config struct {
	// Endpoint is the edge's tunnel endpoint, "host:port" (plain) or "https://host:port" (TLS).
	Endpoint string
	// TLS is the client TLS configuration for an https endpoint (nil: system roots).
	TLS *tls.Config
	// MachineID is sent as machine-id metadata (the SMBIOS UUID).
	MachineID string
	// Disks are files standing in for block devices; WipeDisks zeroes them.
	Disks []string
	// IPMI is the BMC user table (nil: the machine has no BMC).
	IPMI *IPMI
	// BMC, when set, is the machine's real BMC behind the power-management RPCs instead of IPMI.
	BMC BMC
	// OnReboot is called by the Reboot RPC (optional).
	OnReboot func()
	// BeforeWipe is called by WipeDisks before any disk is touched (optional): an error fails the call with
	// nothing wiped. Tests use it to hold a wipe while they act (kill the controller that asked for it).
	BeforeWipe func(ctx context.Context) error
	// AfterWipe is called by WipeDisks once every disk is wiped, before it answers (optional).
	AfterWipe func(ctx context.Context)
	// Source is the local address the agent dials from ("": any), as a machine on its own address does.
	Source string
	// RetryInterval is the pause between tunnel attempts (default 1s).
	RetryInterval time.Duration
	// Logger is required.
	Logger *zap.Logger
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case c.Endpoint == "":
		return errors.New("endpoint is required")
	case c.MachineID == "":
		return errors.New("machine id is required")
	case c.Logger == nil:
		return errors.New("logger is required")
	}

	return nil
}

// IPMI is the injectable BMC of a test machine: its LAN address and its user table.
type IPMI struct {
	// Address and Port are what GetPowerManagement reports.
	Address string
	Port    uint32

	mu    sync.Mutex
	users map[string]string
}

// SetUser creates or updates a BMC user.
func (i *IPMI) SetUser(name, password string) {
	i.mu.Lock()
	defer i.mu.Unlock()

	if i.users == nil {
		i.users = map[string]string{}
	}

	i.users[name] = password
}

// Password returns a user's password.
func (i *IPMI) Password(name string) (string, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()

	p, ok := i.users[name]

	return p, ok
}

// Agent is a running test agent.
type Agent struct {
	cfg Config
	log *zap.Logger
}

// New returns an Agent.
func New(cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("test agent config: %w", err)
	}

	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}

	return &Agent{cfg: cfg, log: cfg.Logger.With(zap.String("component", "testagent"))}, nil
}

// Run keeps a reverse tunnel open to the edge until ctx ends, reconnecting after failures; it
// returns nil on cancellation.
func (a *Agent) Run(ctx context.Context) error {
	for {
		err := a.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}

		a.log.Info("agent tunnel ended, retrying", zap.Error(err))

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(a.cfg.RetryInterval):
		}
	}
}

// RunOnce opens one reverse tunnel and serves it until it ends or ctx ends (then it returns nil).
func (a *Agent) RunOnce(ctx context.Context) error {
	target := a.cfg.Endpoint
	creds := insecure.NewCredentials()

	if rest, ok := strings.CutPrefix(target, "https://"); ok {
		target = rest
		creds = credentials.NewTLS(a.cfg.TLS)
	} else {
		target = strings.TrimPrefix(target, "http://")
	}

	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}

	if a.cfg.Source != "" {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(a.cfg.Source)}}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}))
	}

	conn, err := grpc.NewClient("passthrough:///"+target, opts...)
	if err != nil {
		return fmt.Errorf("dial edge %s: %w", a.cfg.Endpoint, err)
	}
	defer conn.Close() //nolint:errcheck

	srv := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
	agentpb.RegisterAgentServiceServer(srv, &service{cfg: a.cfg, log: a.log})

	tctx := metadata.AppendToOutgoingContext(ctx, MachineIDKey, a.cfg.MachineID)

	started, err := srv.Serve(tctx)

	srv.Stop()

	if ctx.Err() != nil {
		return nil
	}

	if !started {
		return fmt.Errorf("open agent tunnel to %s: %w", a.cfg.Endpoint, err)
	}

	if err != nil {
		return fmt.Errorf("serve agent tunnel to %s: %w", a.cfg.Endpoint, err)
	}

	return nil
}

type service struct {
	agentpb.UnimplementedAgentServiceServer

	cfg Config
	log *zap.Logger
}

func (s *service) Hello(context.Context, *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	return &agentpb.HelloResponse{}, nil
}

func (s *service) GetPowerManagement(_ context.Context, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	resp := &agentpb.GetPowerManagementResponse{}

	if req.GetIpmi() != nil && s.cfg.BMC != nil {
		return s.bmcPowerManagement(req)
	}

	if req.GetIpmi() != nil && s.cfg.IPMI != nil {
		_, exists := s.cfg.IPMI.Password(req.GetIpmi().GetCheckUsername())

		resp.Ipmi = &agentpb.GetPowerManagementResponse_IPMI{
			Address:    s.cfg.IPMI.Address,
			Port:       s.cfg.IPMI.Port,
			UserExists: exists,
		}
	}

	return resp, nil
}

func (s *service) SetPowerManagement(_ context.Context, req *agentpb.SetPowerManagementRequest) (*agentpb.SetPowerManagementResponse, error) {
	if req.GetIpmi() == nil {
		return &agentpb.SetPowerManagementResponse{}, nil
	}

	if s.cfg.IPMI == nil && s.cfg.BMC == nil {
		return nil, status.Error(codes.FailedPrecondition, "machine has no IPMI")
	}

	if req.GetIpmi().GetUsername() == "" || req.GetIpmi().GetPassword() == "" {
		return nil, status.Error(codes.InvalidArgument, "username and password are required")
	}

	if s.cfg.BMC != nil {
		return s.bmcSetUser(req)
	}

	s.cfg.IPMI.SetUser(req.GetIpmi().GetUsername(), req.GetIpmi().GetPassword())
	s.log.Info("ipmi user set", zap.String("username", req.GetIpmi().GetUsername()))

	return &agentpb.SetPowerManagementResponse{}, nil
}

func (s *service) Reboot(context.Context, *agentpb.RebootRequest) (*agentpb.RebootResponse, error) {
	if s.cfg.OnReboot != nil {
		s.cfg.OnReboot()
	}

	return &agentpb.RebootResponse{}, nil
}

// fastWipeBytes is how much of each end of a disk a fast (non-zeroes) wipe clears, as Talos's
// fast wipe clears the partition tables and superblocks.
const fastWipeBytes = 1 << 20

func (s *service) WipeDisks(ctx context.Context, req *agentpb.WipeDisksRequest) (*agentpb.WipeDisksResponse, error) {
	if s.cfg.BeforeWipe != nil {
		if err := s.cfg.BeforeWipe(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "wipe not started: %v", err)
		}
	}

	for _, path := range s.cfg.Disks {
		if err := wipe(ctx, path, req.GetZeroes()); err != nil {
			return nil, status.Errorf(codes.Internal, "wipe %s: %v", path, err)
		}

		s.log.Info("disk wiped", zap.String("disk", path), zap.Bool("zeroes", req.GetZeroes()))
	}

	if s.cfg.AfterWipe != nil {
		s.cfg.AfterWipe(ctx)
	}

	return &agentpb.WipeDisksResponse{}, nil
}

func wipe(ctx context.Context, path string, zeroes bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}

	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close() //nolint:errcheck

		return err
	}

	ranges := [][2]int64{{0, size}}
	if !zeroes && size > 2*fastWipeBytes {
		ranges = [][2]int64{{0, fastWipeBytes}, {size - fastWipeBytes, size}}
	}

	buf := make([]byte, 1<<20)

	for _, r := range ranges {
		for off := r[0]; off < r[1]; {
			if err := ctx.Err(); err != nil {
				f.Close() //nolint:errcheck

				return err
			}

			n := min(int64(len(buf)), r[1]-off)
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				f.Close() //nolint:errcheck

				return err
			}

			off += n
		}
	}

	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck

		return err
	}

	return f.Close()
}
