package bootplans_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestDecide(t *testing.T) {
	t.Parallel()

	ready := bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true}

	for _, tc := range []struct {
		name string
		mod  func(*bootplans.Situation)
		want bootplans.Mode
	}{
		{name: "rejected", want: bootplans.ModeDeny, mod: func(s *bootplans.Situation) { s.Acceptance = bootplans.Rejected }},
		{name: "pending", want: bootplans.ModeAgent, mod: func(s *bootplans.Situation) { s.Acceptance = bootplans.Pending }},
		{name: "deleting", want: bootplans.ModeAgent, mod: func(s *bootplans.Situation) { s.Deleting = true }},
		{name: "not allocated", want: bootplans.ModeAgent, mod: func(s *bootplans.Situation) { s.Allocated = false }},
		{name: "no bmc", want: bootplans.ModeAgent, mod: func(s *bootplans.Situation) { s.BMCConfigured = false }},
		{name: "wipe pending beats installed", want: bootplans.ModeAgent, mod: func(s *bootplans.Situation) { s.RequiresWipe, s.Installed = true, true }},
		{name: "installed", want: bootplans.ModeDisk, mod: func(s *bootplans.Situation) { s.Installed = true }},
		{name: "allocated, not installed", want: bootplans.ModeInstall, mod: func(*bootplans.Situation) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			s := ready
			tc.mod(&s)
			require.Equal(t, tc.want, bootplans.Decide(s))
		})
	}
}

type resolver struct{ last assets.Profile }

func (r *resolver) Resolve(_ context.Context, p assets.Profile) (assets.Boot, error) {
	r.last = p

	return assets.Boot{KernelURL: "k/" + p.TalosVersion, InitrdURL: "i/" + p.TalosVersion, Installer: "installer:" + p.TalosVersion, KernelArgs: p.KernelArgs}, nil
}

func TestPlanner(t *testing.T) {
	t.Parallel()

	res := &resolver{}
	p, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), res)
	require.NoError(t, err)

	ctx := context.Background()

	agent, err := p.Plan(ctx, bootplans.Machine{ID: "m1", ExtraKernelArgs: "foo=bar  baz"})
	require.NoError(t, err)
	require.Equal(t, bootplans.ModeAgent, agent.Mode)
	require.Equal(t, []string{"talos.platform=metal", "console=ttyS0,115200", "foo=bar", "baz"}, agent.KernelArgs)
	require.Equal(t, []string{"siderolabs/metal-agent"}, res.last.Extensions)
	require.Equal(t, metal.AMD64, res.last.Arch)
	require.Empty(t, agent.Installer, "agent mode installs nothing: no installer image wanted at the site")

	// Omni writes the cluster's Talos version without the v
	install, err := p.Plan(ctx, bootplans.Machine{ID: "m1", TalosVersion: "1.11.0", Extensions: []string{"b", "a", "a"},
		ExtraKernelArgs: "foo=bar", Situation: bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true}})
	require.NoError(t, err)
	require.Equal(t, bootplans.ModeInstall, install.Mode)
	require.Equal(t, "k/v1.11.0", install.KernelURL)
	require.Equal(t, "installer:v1.11.0", install.Installer)
	require.Equal(t, []string{"a", "b"}, res.last.Extensions)
	require.Equal(t, []string{"talos.platform=metal", "console=ttyS0,115200", "foo=bar"}, install.KernelArgs,
		"the planner adds nothing the edge knows better (talos.config, the agent address)")

	disk, err := p.Plan(ctx, bootplans.Machine{ID: "m1", SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON,
		Situation: bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true, Installed: true}})
	require.NoError(t, err)
	require.Equal(t, bootplans.Plan{MachineID: "m1", Mode: bootplans.ModeDisk, DiskMethod: bootplans.DiskHTTP404,
		SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON}, disk, "the machine's Secure Boot goes with every plan")

	wire, err := bootplans.ToProto(disk)
	require.NoError(t, err)
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_ON, wire.GetSecureBoot(), "and to its edge")
	require.False(t, disk.Equal(bootplans.Plan{MachineID: "m1", Mode: bootplans.ModeDisk, DiskMethod: bootplans.DiskHTTP404}),
		"a plan whose Secure Boot changed is pushed again")

	deny, err := p.Plan(ctx, bootplans.Machine{ID: "m1", Situation: bootplans.Situation{Acceptance: bootplans.Rejected}})
	require.NoError(t, err)
	require.Equal(t, bootplans.ModeDeny, deny.Mode)

	_, err = bootplans.NewPlanner(bootplans.PlannerConfig{AgentTalosVersion: "v1", DiskMethod: "bogus"}, res)
	require.Error(t, err)
}

// With the edges' own agent image, agent-mode plans name no kernel (the edge boots /assets/agent/<arch>/...)
// and resolve nothing; install plans still resolve.
func TestPlannerEdgeAgentImage(t *testing.T) {
	t.Parallel()

	cfg := bootplans.DefaultPlannerConfig()
	cfg.EdgeAgentImage = true

	res := &resolver{}
	p, err := bootplans.NewPlanner(cfg, res)
	require.NoError(t, err)

	agent, err := p.Plan(t.Context(), bootplans.Machine{ID: "m1", ExtraKernelArgs: "foo=bar"})
	require.NoError(t, err)
	require.Equal(t, bootplans.ModeAgent, agent.Mode)
	require.Empty(t, agent.KernelURL+agent.InitrdURL+agent.UpstreamKernelURL)
	require.Equal(t, metal.AMD64, agent.Arch)
	require.Equal(t, []string{"talos.platform=metal", "console=ttyS0,115200", "foo=bar"}, agent.KernelArgs)
	require.Empty(t, res.last.TalosVersion, "nothing resolved for agent mode")

	install, err := p.Plan(t.Context(), bootplans.Machine{ID: "m1", TalosVersion: "v1.11.0",
		Situation: bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true}})
	require.NoError(t, err)
	require.Equal(t, "k/v1.11.0", install.KernelURL)
}

// A machine that enforces Secure Boot, at a site whose edge said how its machines reach it, gets its boot as a
// signed image whose schematic carries the edge's addresses (talos.config; in agent mode also the agents'
// endpoint), and no kernel or initramfs; the source without a signed image, an edge that has not said, or
// Secure Boot off leave the plan as it was.
func TestPlannerSecureBoot(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	res, err := assets.NewLocalResolver(dir, "/assets/install")
	require.NoError(t, err)

	p, err := bootplans.NewPlanner(bootplans.DefaultPlannerConfig(), res)
	require.NoError(t, err)

	reach := &bootpb.Reach{HttpBase: "http://10.0.0.2:8080", AgentAddress: "10.0.0.2:50000"}
	installing := bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true}
	install := bootplans.Machine{ID: "m1", TalosVersion: "v1.11.5", Situation: installing, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, Reach: reach}
	agent := bootplans.Machine{ID: "m1", SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, Reach: reach}

	// The local directory holds the kernel and initramfs of both profiles; the signed images come below.
	place := func(sc assets.Profile, files ...string) string {
		id, err := sc.Schematic().ID()
		require.NoError(t, err)

		for _, f := range files {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, id, sc.Normalize().TalosVersion), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, id, sc.Normalize().TalosVersion, f), []byte(f), 0o644))
		}

		return id
	}
	place(assets.Profile{TalosVersion: "v1.11.5"}, "kernel-amd64", "initramfs-amd64.xz")
	place(assets.Profile{TalosVersion: "v1.11.0", Extensions: []string{"siderolabs/metal-agent"}}, "kernel-amd64", "initramfs-amd64.xz")

	installArgs := []string{"talos.platform=metal", "console=ttyS0,115200", "talos.config=http://10.0.0.2:8080/config?u=${uuid}"}
	agentArgs := append(slices.Clone(installArgs), "metal.provider.address=10.0.0.2:50000")

	// Without the signed images: kernel and initramfs, as for any machine (the edge's own signed file).
	plan, err := p.Plan(t.Context(), install)
	require.NoError(t, err)
	require.Empty(t, plan.SignedURL)
	require.NotEmpty(t, plan.KernelURL)

	installID := place(assets.Profile{TalosVersion: "v1.11.5", KernelArgs: installArgs, SecureBoot: true}, "metal-amd64-secureboot-uki.efi")
	agentID := place(assets.Profile{TalosVersion: "v1.11.0", Extensions: []string{"siderolabs/metal-agent"}, KernelArgs: agentArgs, SecureBoot: true},
		"metal-amd64-secureboot-uki.efi")

	plan, err = p.Plan(t.Context(), install)
	require.NoError(t, err)
	require.Equal(t, "/assets/install/"+installID+"/v1.11.5/metal-amd64-secureboot-uki.efi", plan.SignedURL,
		"the signed image whose schematic holds talos.config of the machine's edge")
	require.Empty(t, plan.KernelURL+plan.InitrdURL, "a machine that boots the signed image wants no kernel")

	wire, err := bootplans.ToProto(plan)
	require.NoError(t, err)
	require.Equal(t, plan.SignedURL, wire.GetSignedImage().GetUrl(), "and to its edge")

	plan, err = p.Plan(t.Context(), agent)
	require.NoError(t, err)
	require.Equal(t, "/assets/install/"+agentID+"/v1.11.0/metal-amd64-secureboot-uki.efi", plan.SignedURL,
		"agent mode's signed image also names the agents' endpoint")

	// With the edges' own agent image, agent mode of a Secure Boot machine still comes signed from the source
	// (the edges' image cannot carry a site's addresses); without Secure Boot it names nothing, as before.
	edgeCfg := bootplans.DefaultPlannerConfig()
	edgeCfg.EdgeAgentImage = true
	edgePlanner, err := bootplans.NewPlanner(edgeCfg, assets.TolerateMissingAgent(res, edgeCfg.AgentTalosVersion)) // as the controller builds it
	require.NoError(t, err)

	plan, err = edgePlanner.Plan(t.Context(), agent)
	require.NoError(t, err)
	require.Equal(t, "/assets/install/"+agentID+"/v1.11.0/metal-amd64-secureboot-uki.efi", plan.SignedURL)

	plan, err = edgePlanner.Plan(t.Context(), bootplans.Machine{ID: "m1", Reach: reach})
	require.NoError(t, err)
	require.Empty(t, plan.SignedURL+plan.KernelURL, "the edge's own agent image")
	require.Equal(t, []string{"talos.platform=metal", "console=ttyS0,115200"}, plan.KernelArgs)

	plan, err = edgePlanner.Plan(t.Context(), bootplans.Machine{ID: "m1", Arch: metal.ARM64, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, Reach: reach})
	require.NoError(t, err)
	require.Empty(t, plan.SignedURL+plan.KernelURL, "no signed image for arm64 in the source: the edge's own signed file")
	require.Equal(t, []string{"talos.platform=metal", "console=ttyS0,115200"}, plan.KernelArgs, "with nothing baked for a signed image")

	// The edge has not said how machines reach it, or Secure Boot is off: no signed image.
	for _, m := range []bootplans.Machine{
		{ID: "m1", TalosVersion: "v1.11.5", Situation: installing, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON},
		{ID: "m1", TalosVersion: "v1.11.5", Situation: installing, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_OFF, Reach: reach},
	} {
		plan, err = p.Plan(t.Context(), m)
		require.NoError(t, err)
		require.Empty(t, plan.SignedURL)
		require.NotEmpty(t, plan.KernelURL)

		wire, err = bootplans.ToProto(plan)
		require.NoError(t, err)
		require.Nil(t, wire.GetSignedImage())
	}
}
