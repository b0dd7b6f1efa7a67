package fleet

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/shared/metal"
)

// machine is a simulated machine: a power state and, while powered, a boot sequence run against its site's
// edge (DHCP seen, boot.ipxe from the boot table, then what the script boots into).
type machine struct {
	site  *site
	id    string // SMBIOS UUID, lower case
	mac   net.HardwareAddr
	ip    netip.Addr // its own address, or its site's when agents share the site's connection
	bmc   *simBMC
	index int // in the fleet

	mu     sync.Mutex
	on     bool
	cancel context.CancelFunc // ends what the machine runs now
	done   chan struct{}

	boots       atomic.Int64
	wipes       atomic.Int64
	provisioned atomic.Bool
	agentUp     atomic.Bool
	installs    atomic.Int64
}

func (m *machine) powered() bool {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.on
}

// powerOn starts the machine when it is off.
func (m *machine) powerOn() {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.on {
		return
	}

	m.on = true
	m.startLocked()
}

// powerOff stops the machine at once (its agent tunnel goes with it).
func (m *machine) powerOff() {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.on = false
	m.stopLocked()
}

// reset restarts the machine (powering it on when off), as a power cycle does.
func (m *machine) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.stopLocked()
	m.on = true
	m.startLocked()
}

func (m *machine) startLocked() {
	ctx, cancel := context.WithCancel(m.site.ctx)
	done := make(chan struct{})
	m.cancel, m.done = cancel, done

	go func() {
		defer close(done)

		m.run(ctx)
	}()
}

func (m *machine) stopLocked() {
	if m.cancel == nil {
		return
	}

	m.cancel()
	<-m.done
	m.cancel, m.done = nil, nil
}

// run is one power-on: firmware, network boot, and what the boot table says to run, until ctx ends.
func (m *machine) run(ctx context.Context) {
	f := m.site.fleet

	for {
		if sleep(ctx, f.cfg.BootDelay/2+f.jitter(f.cfg.BootDelay)) != nil {
			return
		}

		m.boots.Add(1)

		// The ProxyDHCP answers the firmware's PXE request and journals it.
		m.site.edge.Journal().DHCPSeen(dhcp.Seen{MAC: m.mac, Firmware: dhcp.FirmwareUEFIx86})

		mode, err := m.site.bootScript(m)
		if err != nil {
			m.site.log.Debug("boot script failed", zap.String("machine", m.id), zap.Error(err))

			continue
		}

		switch mode {
		case httpd.ModeAgent:
			m.runAgent(ctx)

			return
		case httpd.ModeInstall:
			// The installer writes Talos to disk and Talos reports the install to Omni; then the machine reboots.
			if sleep(ctx, f.cfg.InstallTime) != nil {
				return
			}

			m.installs.Add(1)

			if f.installed != nil {
				if err := f.installed(ctx, m.id); err != nil && ctx.Err() == nil {
					m.site.log.Warn("install event not counted", zap.String("machine", m.id), zap.Error(err))
				}
			}
		case httpd.ModeWait:
			if sleep(ctx, 30*time.Second) != nil {
				return
			}
		default: // disk: Talos runs from disk, nothing the edge sees; deny: the machine sits in its firmware
			<-ctx.Done()

			return
		}
	}
}

// runAgent is agent mode: the agent joins Omni with the join config from the edge's /config, then keeps its
// reverse tunnel to the edge open (reconnecting as the real agent does) until the machine stops.
func (m *machine) runAgent(ctx context.Context) {
	f := m.site.fleet

	for !m.provisioned.Load() || f.cfg.ProvisionEveryBoot {
		err := m.site.provision(ctx, m)
		if err == nil {
			m.provisioned.Store(true)

			break
		}

		if ctx.Err() != nil {
			return
		}

		m.site.log.Debug("provision failed, retrying", zap.String("machine", m.id), zap.Error(err))

		if sleep(ctx, 2*time.Second+f.jitter(2*time.Second)) != nil {
			return
		}
	}

	var conn *grpc.ClientConn

	if f.cfg.AgentConns == "site" {
		conn = m.site.agentConns[m.index%f.cfg.MachinesPerSite/agentsPerConn]
	} else {
		c, err := m.site.dialAgent(m.ip)
		if err != nil {
			m.site.log.Warn("agent connection", zap.String("machine", m.id), zap.Error(err))

			return
		}
		defer c.Close() //nolint:errcheck

		conn = c
	}

	for ctx.Err() == nil {
		srv := grpctunnel.NewReverseTunnelServer(tunnelpb.NewTunnelServiceClient(conn))
		agentpb.RegisterAgentServiceServer(srv, &agent{m: m})

		tctx := metadata.AppendToOutgoingContext(ctx, metal.MetadataKey, m.id)

		m.agentUp.Store(true)
		started, err := srv.Serve(tctx)
		m.agentUp.Store(false)

		srv.Stop()

		if ctx.Err() != nil {
			return
		}

		m.site.log.Debug("agent tunnel ended, retrying", zap.String("machine", m.id), zap.Bool("started", started), zap.Error(err))

		if sleep(ctx, time.Second) != nil {
			return
		}
	}
}

// agent is the machine's AgentService (management.AgentService of talos-metal-agent), served over its tunnel:
// the calls the controller makes, answered from the simulated hardware.
type agent struct {
	agentpb.UnimplementedAgentServiceServer

	m *machine
}

func (a *agent) Hello(context.Context, *agentpb.HelloRequest) (*agentpb.HelloResponse, error) {
	return &agentpb.HelloResponse{}, nil
}

func (a *agent) GetPowerManagement(_ context.Context, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	resp := &agentpb.GetPowerManagementResponse{}

	if req.GetIpmi() != nil {
		b := a.m.bmc
		resp.Ipmi = &agentpb.GetPowerManagementResponse_IPMI{
			Address: b.host, Port: b.port, UserExists: b.userExists(req.GetIpmi().GetCheckUsername()),
		}
	}

	return resp, nil
}

func (a *agent) SetPowerManagement(_ context.Context, req *agentpb.SetPowerManagementRequest) (*agentpb.SetPowerManagementResponse, error) {
	if ipmi := req.GetIpmi(); ipmi != nil {
		if ipmi.GetUsername() == "" || ipmi.GetPassword() == "" {
			return nil, status.Error(codes.InvalidArgument, "username and password are required")
		}

		a.m.bmc.setUser(ipmi.GetUsername(), ipmi.GetPassword())
	}

	return &agentpb.SetPowerManagementResponse{}, nil
}

func (a *agent) WipeDisks(ctx context.Context, _ *agentpb.WipeDisksRequest) (*agentpb.WipeDisksResponse, error) {
	if err := sleep(ctx, a.m.site.fleet.cfg.WipeTime); err != nil {
		return nil, status.FromContextError(err).Err()
	}

	a.m.wipes.Add(1)

	return &agentpb.WipeDisksResponse{}, nil
}

func (a *agent) Reboot(context.Context, *agentpb.RebootRequest) (*agentpb.RebootResponse, error) {
	go a.m.reset() // after the answer, as the agent's reboot does

	return &agentpb.RebootResponse{}, nil
}
