package bootplans_test

import (
	"context"
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

	return assets.Boot{KernelURL: "k/" + p.TalosVersion, InitrdURL: "i/" + p.TalosVersion, KernelArgs: p.KernelArgs}, nil
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

	// Omni writes the cluster's Talos version without the v
	install, err := p.Plan(ctx, bootplans.Machine{ID: "m1", TalosVersion: "1.11.0", Extensions: []string{"b", "a", "a"},
		ExtraKernelArgs: "foo=bar", Situation: bootplans.Situation{Acceptance: bootplans.Accepted, Allocated: true, BMCConfigured: true}})
	require.NoError(t, err)
	require.Equal(t, bootplans.ModeInstall, install.Mode)
	require.Equal(t, "k/v1.11.0", install.KernelURL)
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
