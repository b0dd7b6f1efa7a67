package app

import (
	"context"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
)

// assetAwarePusher joins the lifecycle's plan pushes to the asset side: before a machine's plan goes to its
// edge, the site is told which assets the plan names (kernel and initramfs from the controller's local install
// files, or from upstream with the installer image, which the controller's library fetches once), so the site
// caches them, or receives them by relay, and never evicts them while a plan names them.
type assetAwarePusher struct {
	next    lifecycle.PlanPusher
	needs   *assets.Needs
	install *assets.InstallFiles
}

// Push implements lifecycle.PlanPusher.
func (p *assetAwarePusher) Push(ctx context.Context, siteID string, plan bootplans.Plan) (uint64, error) {
	// Agent-mode plans count too: without agent images of its own (--agent-assets-dir) the controller
	// resolves agent mode from these same local assets (the metal-agent schematic).
	var (
		refs  []*assetspb.AssetRef
		wants []assets.Want
	)

	if plan.Mode.PXE() {
		var err error
		if refs, err = p.install.Refs(plan.MachineID.String(), plan.KernelURL, plan.InitrdURL, plan.SignedURL); err != nil {
			return 0, err
		}

		wants = assets.Boot{
			KernelURL: plan.KernelURL, InitrdURL: plan.InitrdURL, Installer: plan.Installer,
			UpstreamKernelURL: plan.UpstreamKernelURL, UpstreamInitrdURL: plan.UpstreamInitrdURL,
			SignedURL: plan.SignedURL, UpstreamSignedURL: plan.UpstreamSignedURL,
		}.Wants(plan.Arch.String())
	}

	p.needs.SetMachine(siteID, plan.MachineID.String(), refs, wants...)

	return p.next.Push(ctx, siteID, plan)
}

// Holds implements lifecycle.PlanPusher.
func (p *assetAwarePusher) Holds(siteID string, plan bootplans.Plan) bool {
	return p.next.Holds(siteID, plan)
}
