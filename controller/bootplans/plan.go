// Package bootplans decides each machine's boot plan: what its site's edge answers when it network-boots
// (agent mode, Talos install, boot from disk, or deny), decided from the lifecycle state as a static Omni
// provider must (Decide), with the boot assets and the site's addresses filled in (Planner). The plans go into
// the sites' boot tables (controller/boottables); what the edges saw comes back as events
// (controller/bootevents).
package bootplans

import (
	"context"
	"fmt"
	"slices"
	"strings"

	agentconfig "github.com/siderolabs/talos-metal-agent/pkg/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/outpost-metal/outpost/controller/assets"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Mode is what a machine boots into next.
type Mode string

// Boot modes.
const (
	// ModeAgent boots the discovery/maintenance image with the metal agent.
	ModeAgent Mode = "agent"
	// ModeInstall boots the Talos installer for the machine's cluster.
	ModeInstall Mode = "install"
	// ModeDisk makes the machine boot from its disk.
	ModeDisk Mode = "disk"
	// ModeDeny refuses network boot (rejected machines).
	ModeDeny Mode = "deny"
)

// PXE reports whether the mode boots over the network (so a one-time PXE boot must be set before power-on).
func (m Mode) PXE() bool { return m == ModeAgent || m == ModeInstall }

// DiskMethod is how the edge makes a machine boot from disk.
type DiskMethod string

// Disk boot methods (the edge implements them).
const (
	DiskIPXEExit    DiskMethod = "ipxe-exit"
	DiskHTTP404     DiskMethod = "http-404"
	DiskIPXESanboot DiskMethod = "ipxe-sanboot"
)

// Acceptance mirrors Omni's acceptance status of a machine.
type Acceptance int

// Acceptance states.
const (
	Pending Acceptance = iota
	Accepted
	Rejected
)

// Situation is what the boot decision depends on, as the lifecycle sees a machine.
type Situation struct {
	Acceptance    Acceptance
	Deleting      bool
	Allocated     bool
	BMCConfigured bool
	RequiresWipe  bool
	Installed     bool
}

// Decide is the boot decision of a static Omni provider, first match wins: rejected -> deny; pending, being
// deleted, not allocated, no BMC yet, or a wipe pending -> agent; installed -> disk; otherwise -> install.
func Decide(s Situation) Mode {
	switch {
	case s.Acceptance == Rejected:
		return ModeDeny
	case s.Acceptance == Pending, s.Deleting, !s.Allocated, !s.BMCConfigured, s.RequiresWipe:
		return ModeAgent
	case s.Installed:
		return ModeDisk
	default:
		return ModeInstall
	}
}

// Plan is one machine's boot plan as pushed to its site's edge.
type Plan struct {
	MachineID metal.ID
	Mode      Mode
	// KernelURL and InitrdURL are the kernel and initramfs to boot (edge-local /assets/ names, or URLs).
	KernelURL, InitrdURL string
	// UpstreamKernelURL and UpstreamInitrdURL are where a passthrough site's machines fetch them instead.
	UpstreamKernelURL, UpstreamInitrdURL string
	// Installer is the installer image Talos pulls after an install boot ("" when the source has none).
	Installer string
	// KernelArgs is the full extra kernel command line (agent/install).
	KernelArgs []string
	// DiskMethod is set for ModeDisk.
	DiskMethod DiskMethod
	// Arch is the architecture the assets are for.
	Arch metal.Arch
	// MACs are the machine's interfaces (the edge matches DHCP requests by them).
	MACs []string
	// SecureBoot is whether the machine's firmware enforces Secure Boot, so the edge offers it only the signed
	// image (unspecified: nobody said, and the edge's own setting decides).
	SecureBoot bootpb.SecureBoot
	// SignedURL is the plan's boot as a signed unified kernel image (agent or install mode of a machine that
	// enforces Secure Boot; "" when its source has none, and the edge's own signed file is what it boots),
	// edge-local like KernelURL; UpstreamSignedURL is where a passthrough site's machines fetch it instead.
	SignedURL, UpstreamSignedURL string
}

// Equal reports whether two plans are the same.
func (p Plan) Equal(o Plan) bool {
	return p.MachineID == o.MachineID && p.Mode == o.Mode && p.KernelURL == o.KernelURL && p.InitrdURL == o.InitrdURL &&
		p.UpstreamKernelURL == o.UpstreamKernelURL && p.UpstreamInitrdURL == o.UpstreamInitrdURL && p.Installer == o.Installer && slices.Equal(p.KernelArgs, o.KernelArgs) && p.DiskMethod == o.DiskMethod && p.Arch == o.Arch &&
		slices.Equal(p.MACs, o.MACs) && p.SecureBoot == o.SecureBoot && p.SignedURL == o.SignedURL && p.UpstreamSignedURL == o.UpstreamSignedURL
}

// Machine is the per-machine input of a plan.
type Machine struct {
	ID              metal.ID
	Situation       Situation
	TalosVersion    string
	Extensions      []string
	ExtraKernelArgs string
	Arch            metal.Arch
	// SecureBoot is whether its firmware enforces Secure Boot, as the controller knows it.
	SecureBoot bootpb.SecureBoot
	// Reach is how machines reach the edge of its site, as the edge said (nil: not known yet). A signed
	// image's command line is locked, so the edge's addresses are baked into it: without them a machine that
	// enforces Secure Boot gets no signed image of its own.
	Reach *bootpb.Reach
}

// PlannerConfig configures a Planner.
type PlannerConfig struct {
	// AgentTalosVersion is the Talos version booted in agent mode; its extension catalog must hold the metal agent.
	AgentTalosVersion string
	// AgentExtensions are the extensions of the agent-mode image (default: siderolabs/metal-agent).
	AgentExtensions []string
	// Console is the console kernel argument (e.g. ttyS0,115200).
	Console string
	// DiskMethod is how machines boot from disk.
	DiskMethod DiskMethod
	// EdgeAgentImage makes agent-mode plans name no kernel: edges boot the agent image they hold under their
	// default names (/assets/agent/<arch>/...), the one the controller hands every site (--agent-assets-dir),
	// instead of one resolved from AgentTalosVersion and AgentExtensions.
	EdgeAgentImage bool
}

// DefaultPlannerConfig returns the planner defaults.
func DefaultPlannerConfig() PlannerConfig {
	return PlannerConfig{
		AgentTalosVersion: "v1.11.0",
		AgentExtensions:   []string{"siderolabs/metal-agent"},
		Console:           "ttyS0,115200",
		DiskMethod:        DiskHTTP404,
	}
}

// Validate reports a configuration that cannot work.
func (c PlannerConfig) Validate() error {
	if _, err := assets.CanonicalTalosVersion(c.AgentTalosVersion); err != nil {
		return fmt.Errorf("agent %w", err)
	}

	switch c.DiskMethod {
	case DiskIPXEExit, DiskHTTP404, DiskIPXESanboot:
	default:
		return fmt.Errorf("disk method %q: want ipxe-exit, http-404 or ipxe-sanboot", c.DiskMethod)
	}

	return nil
}

// Planner computes boot plans, resolving install assets with an assets.Resolver.
type Planner struct {
	cfg      PlannerConfig
	resolver assets.Resolver
}

// NewPlanner returns a Planner.
func NewPlanner(cfg PlannerConfig, resolver assets.Resolver) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("planner config: %w", err)
	}

	// validated above: the version is well-formed
	cfg.AgentTalosVersion, _ = assets.CanonicalTalosVersion(cfg.AgentTalosVersion)

	return &Planner{cfg: cfg, resolver: resolver}, nil
}

// Plan computes machine m's plan.
func (p *Planner) Plan(ctx context.Context, m Machine) (Plan, error) {
	mode := Decide(m.Situation)
	plan := Plan{MachineID: m.ID, Mode: mode, SecureBoot: m.SecureBoot}

	extra := strings.Fields(m.ExtraKernelArgs)

	var profile assets.Profile

	switch mode {
	case ModeDeny:
		return plan, nil
	case ModeDisk:
		plan.DiskMethod = p.cfg.DiskMethod

		return plan, nil
	case ModeAgent, ModeInstall:
		// The edge adds what machines reach it at (talos.config, metal.provider.address) when it renders the
		// boot: only it knows the address a machine reached it by.
		args := []string{constants.KernelParamPlatform + "=" + constants.PlatformMetal}

		if p.cfg.Console != "" {
			args = append(args, "console="+p.cfg.Console)
		}

		args = append(args, extra...)

		if mode == ModeInstall {
			profile = assets.Profile{TalosVersion: m.TalosVersion, Extensions: m.Extensions, KernelArgs: args, Arch: m.Arch}

			break
		}

		profile = assets.Profile{TalosVersion: p.cfg.AgentTalosVersion, Extensions: p.cfg.AgentExtensions, KernelArgs: args, Arch: m.Arch}
	}

	signed := m.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_ON && m.Reach.GetHttpBase() != ""

	// The edges' own agent image: nothing to resolve, unless the machine enforces Secure Boot (that image
	// cannot carry a site's addresses in a locked command line, so its signed image comes from the source).
	edgeAgent := mode == ModeAgent && p.cfg.EdgeAgentImage
	if edgeAgent && !signed {
		return p.edgeAgentPlan(plan, profile), nil
	}

	unsigned := profile

	if signed {
		// A signed image's command line is locked: what the edge would add goes in now.
		profile.SecureBoot = true
		profile.KernelArgs = append(slices.Clone(profile.KernelArgs), constants.KernelParamConfig+"="+m.Reach.GetHttpBase()+"/config?u=${uuid}")

		if mode == ModeAgent && m.Reach.GetAgentAddress() != "" {
			profile.KernelArgs = append(profile.KernelArgs, agentconfig.MetalProviderAddressKernelArg+"="+m.Reach.GetAgentAddress())
		}
	}

	boot, err := p.resolver.Resolve(ctx, profile.Normalize())
	if err != nil {
		return Plan{}, fmt.Errorf("resolve %s assets of %s (talos %s): %w", mode, m.ID, profile.TalosVersion, err)
	}

	plan.Arch = profile.Normalize().Arch
	plan.KernelArgs = boot.KernelArgs

	if mode == ModeInstall {
		plan.Installer = boot.Installer // agent mode installs nothing: its installer is not wanted at the site
	}

	if signed && boot.SignedURL != "" {
		// The machine boots the signed image only: its kernel and initramfs are not wanted at the site.
		plan.SignedURL, plan.UpstreamSignedURL = boot.SignedURL, boot.UpstreamSignedURL

		return plan, nil
	}

	if edgeAgent {
		return p.edgeAgentPlan(plan, unsigned), nil // the source has no signed image: the edge's own signed file
	}

	plan.KernelURL, plan.InitrdURL = boot.KernelURL, boot.InitrdURL
	plan.UpstreamKernelURL, plan.UpstreamInitrdURL = boot.UpstreamKernelURL, boot.UpstreamInitrdURL

	return plan, nil
}

// edgeAgentPlan is an agent-mode plan that names no kernel: the edge boots the agent image it holds.
func (p *Planner) edgeAgentPlan(plan Plan, profile assets.Profile) Plan {
	profile = profile.Normalize()
	plan.Arch, plan.KernelArgs = profile.Arch, profile.KernelArgs

	return plan
}

// ToProto converts a plan to the boot table's form.
func ToProto(p Plan) (*bootpb.Plan, error) {
	out := &bootpb.Plan{Uuid: p.MachineID.String(), Macs: slices.Clone(p.MACs), SecureBoot: p.SecureBoot}

	if p.SignedURL != "" && (p.Mode == ModeAgent || p.Mode == ModeInstall) {
		out.SignedImage = &bootpb.SignedImage{Url: p.SignedURL, UpstreamUrl: p.UpstreamSignedURL}
	}

	switch p.Mode {
	case ModeAgent:
		out.Mode = bootpb.Mode_MODE_AGENT
		out.ExtraArgs = slices.Clone(p.KernelArgs)
	case ModeInstall:
		if p.KernelURL == "" && p.SignedURL == "" {
			return nil, fmt.Errorf("install plan of %s has no kernel", p.MachineID)
		}

		out.Mode = bootpb.Mode_MODE_INSTALL
		out.Install = &bootpb.Kernel{
			KernelUrl: p.KernelURL, InitrdUrl: p.InitrdURL, Args: slices.Clone(p.KernelArgs),
			UpstreamKernelUrl: p.UpstreamKernelURL, UpstreamInitrdUrl: p.UpstreamInitrdURL, Installer: p.Installer,
		}
	case ModeDisk:
		out.Mode = bootpb.Mode_MODE_DISK

		switch p.DiskMethod {
		case DiskHTTP404:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_HTTP_404
		case DiskIPXESanboot:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT
		default:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_EXIT
		}
	case ModeDeny:
		out.Mode = bootpb.Mode_MODE_DENY
	default:
		return nil, fmt.Errorf("plan of %s: unknown mode %q", p.MachineID, p.Mode)
	}

	return out, nil
}
