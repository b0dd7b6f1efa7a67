package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// This file adapts the controller's edge-facing pieces (the uplink's per-site connections, machine access,
// the boot-table sync) to the small interfaces the lifecycle declares.

// connectedFunc tells whether a site has a live uplink session.
type connectedFunc func(siteID string) bool

// edgeClients implements lifecycle.PowerClient and lifecycle.AgentClient over machineaccess.
type edgeClients struct {
	access    *machineaccess.Client
	connected connectedFunc
	machines  *machineBook
}

var (
	_ lifecycle.PowerClient = (*edgeClients)(nil)
	_ lifecycle.AgentClient = (*edgeClients)(nil)
)

// edgeError turns an error from a call through an edge into what the lifecycle branches on: a site that is
// not connected (or dropped during the call) is lifecycle.ErrSiteOffline, so the operation is retried later.
func (e *edgeClients) edgeError(siteID, doing string, err error) error {
	if err == nil {
		return nil
	}

	if !e.connected(siteID) && (status.Code(err) == codes.Unavailable || status.Code(err) == codes.Canceled) {
		return fmt.Errorf("%s at site %s: %w", doing, siteID, lifecycle.ErrSiteOffline)
	}

	return fmt.Errorf("%s at site %s: %w", doing, siteID, err)
}

func (e *edgeClients) bmc(siteID, machineID string, cfg *specs.BMCConfigurationSpec) (*machineaccess.BMC, error) {
	if !e.connected(siteID) {
		return nil, fmt.Errorf("bmc of %s at site %s: %w", machineID, siteID, lifecycle.ErrSiteOffline)
	}

	target, err := bmcTarget(cfg)
	if err != nil {
		return nil, fmt.Errorf("bmc of %s: %w", machineID, err)
	}

	return e.access.BMC(siteID, machineID, target), nil
}

// bmcTarget converts the lifecycle's BMC configuration to the edge's target (credentials included).
func bmcTarget(cfg *specs.BMCConfigurationSpec) (*bmcpb.Target, error) {
	switch {
	case cfg.GetIpmi().GetAddress() != "":
		return &bmcpb.Target{
			Host:     cfg.GetIpmi().GetAddress(),
			IpmiPort: cfg.GetIpmi().GetPort(),
			Username: cfg.GetIpmi().GetUsername(),
			Password: cfg.GetIpmi().GetPassword(),
			Protocol: bmcpb.Protocol_PROTOCOL_AUTO,
		}, nil
	case cfg.GetApiAddress() != "":
		// A Redfish API address without credentials of its own: the machine's BMC is reached by its API alone.
		host := cfg.GetApiAddress()
		if h, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")); err == nil {
			host = h
		}

		return &bmcpb.Target{Host: host, RedfishEndpoint: cfg.GetApiAddress(), Protocol: bmcpb.Protocol_PROTOCOL_REDFISH}, nil
	default:
		return nil, errors.New("no BMC address configured")
	}
}

func (e *edgeClients) PowerStatus(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec) (lifecycle.PowerState, error) {
	b, err := e.bmc(siteID, machineID, cfg)
	if err != nil {
		return lifecycle.PowerUnknown, err
	}

	on, err := b.PowerStatus(ctx)
	if err != nil {
		return lifecycle.PowerUnknown, e.edgeError(siteID, "power status of "+machineID, err)
	}

	if on {
		return lifecycle.PowerOn, nil
	}

	return lifecycle.PowerOff, nil
}

func (e *edgeClients) power(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec, doing string, op func(*machineaccess.BMC, context.Context) error) error {
	b, err := e.bmc(siteID, machineID, cfg)
	if err != nil {
		return err
	}

	return e.edgeError(siteID, doing+" "+machineID, op(b, ctx))
}

func (e *edgeClients) PowerOn(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec) error {
	return e.power(ctx, siteID, machineID, cfg, "power on", (*machineaccess.BMC).PowerOn)
}

func (e *edgeClients) PowerOff(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec) error {
	return e.power(ctx, siteID, machineID, cfg, "power off", (*machineaccess.BMC).PowerOff)
}

func (e *edgeClients) PowerCycle(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec) error {
	return e.power(ctx, siteID, machineID, cfg, "power cycle", (*machineaccess.BMC).PowerCycle)
}

// SetPXEOnce sets a one-time network boot in the firmware mode the machine last network-booted with.
func (e *edgeClients) SetPXEOnce(ctx context.Context, siteID, machineID string, cfg *specs.BMCConfigurationSpec) error {
	mode := e.machines.bootMode(machineID)

	return e.power(ctx, siteID, machineID, cfg, "set one-time PXE of", func(b *machineaccess.BMC, ctx context.Context) error {
		return b.SetPXEOnce(ctx, mode)
	})
}

func (e *edgeClients) agent(siteID, machineID string) (agentpb.AgentServiceClient, error) {
	if !e.connected(siteID) {
		return nil, fmt.Errorf("agent of %s at site %s: %w", machineID, siteID, lifecycle.ErrSiteOffline)
	}

	return e.access.Agent(siteID, machineID), nil
}

func (e *edgeClients) Hello(ctx context.Context, siteID, machineID string) error {
	a, err := e.agent(siteID, machineID)
	if err != nil {
		return err
	}

	_, err = a.Hello(ctx, &agentpb.HelloRequest{})

	return e.edgeError(siteID, "agent hello of "+machineID, err)
}

func (e *edgeClients) GetPowerManagement(ctx context.Context, siteID, machineID string, req *agentpb.GetPowerManagementRequest) (*agentpb.GetPowerManagementResponse, error) {
	a, err := e.agent(siteID, machineID)
	if err != nil {
		return nil, err
	}

	resp, err := a.GetPowerManagement(ctx, req)

	return resp, e.edgeError(siteID, "get power management of "+machineID, err)
}

func (e *edgeClients) SetPowerManagement(ctx context.Context, siteID, machineID string, req *agentpb.SetPowerManagementRequest) error {
	a, err := e.agent(siteID, machineID)
	if err != nil {
		return err
	}

	_, err = a.SetPowerManagement(ctx, req)

	return e.edgeError(siteID, "set power management of "+machineID, err)
}

func (e *edgeClients) WipeDisks(ctx context.Context, siteID, machineID string, zeroes bool) error {
	a, err := e.agent(siteID, machineID)
	if err != nil {
		return err
	}

	_, err = a.WipeDisks(ctx, &agentpb.WipeDisksRequest{Zeroes: zeroes})

	return e.edgeError(siteID, "wipe disks of "+machineID, err)
}

func (e *edgeClients) Reboot(ctx context.Context, siteID, machineID string) error {
	a, err := e.agent(siteID, machineID)
	if err != nil {
		return err
	}

	_, err = a.Reboot(ctx, &agentpb.RebootRequest{})

	return e.edgeError(siteID, "reboot "+machineID, err)
}

// machineBook remembers, from edge events, which firmware each machine network-boots with
// (DHCP tells the firmware by MAC; boot scripts tie MACs to machine UUIDs).
type machineBook struct {
	mu            sync.Mutex
	firmwareByMAC map[string]string
	macByMachine  map[string]string
}

func newMachineBook() *machineBook {
	return &machineBook{firmwareByMAC: map[string]string{}, macByMachine: map[string]string{}}
}

func (b *machineBook) dhcpSeen(mac, firmware string) {
	if mac == "" || firmware == "" {
		return
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	b.firmwareByMAC[strings.ToLower(mac)] = firmware
}

func (b *machineBook) bootServed(machineID, mac string) {
	if machineID == "" || mac == "" {
		return
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	b.macByMachine[machineID] = strings.ToLower(mac)
}

// bootMode is UEFI or BIOS as last seen, or unspecified (the BMC's current mode is kept) when unknown.
func (b *machineBook) bootMode(machineID string) bmcpb.BootMode {
	b.mu.Lock()
	defer b.mu.Unlock()

	fw := b.firmwareByMAC[b.macByMachine[machineID]]

	switch {
	case fw == "bios":
		return bmcpb.BootMode_BOOT_MODE_BIOS
	case strings.HasPrefix(fw, "uefi"), strings.HasPrefix(fw, "http"):
		return bmcpb.BootMode_BOOT_MODE_UEFI
	default:
		return bmcpb.BootMode_BOOT_MODE_UNSPECIFIED
	}
}

// eventHandler learns from edge events where machines are, whether their agents are connected, and
// which firmware they boot with.
type eventHandler struct {
	log       *zap.Logger
	locations *lifecycle.Locations
	machines  *machineBook
}

// HandleEvent implements bootplans.Handler. Malformed machine IDs are logged and skipped: an edge's
// event never blocks the stream of events behind it.
func (h *eventHandler) HandleEvent(_ context.Context, site string, e *bootpb.Event) error {
	var err error

	switch k := e.GetKind().(type) {
	case *bootpb.Event_DhcpSeen:
		h.machines.dhcpSeen(k.DhcpSeen.GetMac(), k.DhcpSeen.GetFirmware())
	case *bootpb.Event_BootServed:
		id := strings.ToLower(k.BootServed.GetUuid())
		if id == "" {
			return nil
		}

		h.machines.bootServed(id, k.BootServed.GetMac())

		if _, err = h.locations.Seen(site, id); err == nil {
			h.locations.SetArch(id, k.BootServed.GetArch())
		}
	case *bootpb.Event_AgentTunnel:
		t := k.AgentTunnel
		if t.GetAddressMismatch() {
			h.log.Warn("agent tunnel from another address than the machine booted from",
				zap.String("site", site), zap.String("machine", t.GetMachineId()),
				zap.String("tunnel_ip", t.GetRemoteIp()), zap.String("boot_ip", t.GetSeenIp()))
		}

		err = h.locations.AgentConnected(site, strings.ToLower(t.GetMachineId()), t.GetOpen())
	}

	if err != nil {
		h.log.Warn("edge event ignored", zap.String("site", site), zap.String("event", bootplans.String(e)), zap.Error(err))
	}

	return nil
}

// planPusher implements lifecycle.PlanPusher: it keeps each site's boot table (one plan per machine plus the
// table-wide join config) and pushes it through bootplans.Plans, returning once the edge acknowledged it.
type planPusher struct {
	plans *bootplans.Plans

	mu     sync.Mutex
	tables map[string]map[string]*bootpb.Plan // site -> machine -> plan
	config []byte
	args   []string
}

func newPlanPusher(plans *bootplans.Plans) *planPusher {
	return &planPusher{plans: plans, tables: map[string]map[string]*bootpb.Plan{}}
}

// Push implements lifecycle.PlanPusher.
func (p *planPusher) Push(ctx context.Context, siteID string, plan bootplans.Plan) (uint64, error) {
	pb, err := toProto(plan)
	if err != nil {
		return 0, err
	}

	p.mu.Lock()
	for site, table := range p.tables {
		if site != siteID {
			delete(table, plan.MachineID) // a machine is planned at one site only
		}
	}

	if p.tables[siteID] == nil {
		p.tables[siteID] = map[string]*bootpb.Plan{}
	}

	p.tables[siteID][plan.MachineID] = pb
	version := p.plans.Set(siteID, p.tableLocked(siteID))
	p.mu.Unlock()

	if err := p.plans.WaitAcked(ctx, siteID, version); err != nil {
		return 0, err
	}

	return version, nil
}

// SetJoinConfig makes config the /config every site serves to agent-mode machines and re-pushes all tables.
func (p *planPusher) SetJoinConfig(config []byte, kernelArgs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.config, p.args = config, kernelArgs

	for site := range p.tables {
		p.plans.Set(site, p.tableLocked(site))
	}
}

// Site makes sure a site has a table (with the join config) even before any of its machines is planned.
func (p *planPusher) Site(siteID string) {
	p.mu.Lock()
	defer p.mu.Unlock()

	if p.tables[siteID] == nil {
		p.tables[siteID] = map[string]*bootpb.Plan{}
		p.plans.Set(siteID, p.tableLocked(siteID))
	}
}

func (p *planPusher) tableLocked(siteID string) *bootpb.Table {
	tbl := &bootpb.Table{Config: p.config, KernelArgs: p.args}

	for _, plan := range p.tables[siteID] {
		tbl.Plans = append(tbl.Plans, plan)
	}

	slices.SortFunc(tbl.Plans, func(a, b *bootpb.Plan) int { return strings.Compare(a.GetUuid(), b.GetUuid()) })

	return tbl
}

// edgeSuppliedArgs are the agent-mode kernel arguments the edge writes itself, with its own address.
var edgeSuppliedArgs = []string{"talos.config=", "metal.provider.address="}

// toProto converts a lifecycle plan to the edge's boot-table entry.
func toProto(plan bootplans.Plan) (*bootpb.Plan, error) {
	out := &bootpb.Plan{Uuid: plan.MachineID}

	switch plan.Mode {
	case bootplans.ModeAgent:
		out.Mode = bootpb.Mode_MODE_AGENT

		for _, a := range plan.KernelArgs {
			if !slices.ContainsFunc(edgeSuppliedArgs, func(p string) bool { return strings.HasPrefix(a, p) }) {
				out.ExtraArgs = append(out.ExtraArgs, a)
			}
		}
	case bootplans.ModeInstall:
		out.Mode = bootpb.Mode_MODE_INSTALL
		out.Install = &bootpb.Kernel{KernelUrl: plan.KernelURL, InitrdUrl: plan.InitrdURL, Args: plan.KernelArgs}

		if plan.KernelURL == "" {
			return nil, fmt.Errorf("install plan of %s has no kernel (image factory scripts are not chained by edges yet)", plan.MachineID)
		}
	case bootplans.ModeDisk:
		out.Mode = bootpb.Mode_MODE_DISK

		switch plan.DiskMethod {
		case bootplans.DiskHTTP404:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_HTTP_404
		case bootplans.DiskIPXESanboot:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT
		default:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_EXIT
		}
	case bootplans.ModeDeny:
		out.Mode = bootpb.Mode_MODE_DENY
	default:
		return nil, fmt.Errorf("plan of %s: unknown mode %q", plan.MachineID, plan.Mode)
	}

	return out, nil
}

// edgeSites implements bootplans.SiteDirectory. Agent-mode addresses (where /config is, where agents dial)
// are the edge's own and it writes them into the boot script itself; the planner's placeholders are dropped
// by toProto.
type edgeSites struct{}

func (edgeSites) Site(string) (bootplans.Site, error) {
	return bootplans.Site{ConfigURL: "http://edge/config", AgentAddress: "edge"}, nil
}
