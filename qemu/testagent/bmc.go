package testagent

import (
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// BMC is a machine's own BMC as the agent reaches it in-band (the lab machine's /init talks to its virtual
// BMC over a serial channel, as the real agent uses /dev/ipmi0).
type BMC interface {
	// LANAddress returns the BMC's IPMI LAN address and port.
	LANAddress() (address string, port uint32, err error)
	// UserExists reports whether a BMC user exists.
	UserExists(name string) (bool, error)
	// SetUser creates or updates an administrator.
	SetUser(name, password string) error
}

func (s *service) bmcPowerManagement(req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	addr, port, err := s.cfg.BMC.LANAddress()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read bmc lan address: %v", err)
	}

	exists, err := s.cfg.BMC.UserExists(req.GetIpmi().GetCheckUsername())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read bmc users: %v", err)
	}

	return &agentpb.GetPowerManagementResponse{Ipmi: &agentpb.GetPowerManagementResponse_IPMI{
		Address: addr, Port: port, UserExists: exists,
	}}, nil
}

func (s *service) bmcSetUser(req *agentpb.SetPowerManagementRequest) (*agentpb.SetPowerManagementResponse, error) {
	if err := s.cfg.BMC.SetUser(req.GetIpmi().GetUsername(), req.GetIpmi().GetPassword()); err != nil {
		return nil, status.Errorf(codes.Unavailable, "set bmc user: %v", err)
	}

	s.log.Info("bmc user set", zap.String("username", req.GetIpmi().GetUsername()))

	return &agentpb.SetPowerManagementResponse{}, nil
}
