package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
)

// assetAwarePusher joins the lifecycle's plan pushes to the asset side: before a machine's plan goes to its
// edge, the site is told which assets the plan names (kernel and initramfs from the controller's local install
// files, or from upstream with the installer image, which the controller's library fetches once), so the site
// caches them, or receives them by relay, and never evicts them while a plan names them. A plan that boots a
// signed image counts as held only once the site can serve that image: its firmware fetches it straight from
// the DHCP answer, with no boot script to wait in as iPXE has, so the machine is not rebooted into it sooner.
type assetAwarePusher struct {
	next    lifecycle.PlanPusher
	needs   *assets.Needs
	install *assets.InstallFiles
	catalog *assets.Catalog
}

// signedWaitPoll is how often a push waits-for-the-image checks the site's asset report.
const signedWaitPoll = 250 * time.Millisecond

// Push implements lifecycle.PlanPusher.
func (p *assetAwarePusher) Push(ctx context.Context, siteID string, plan bootplans.Plan) (uint64, error) {
	refs, wants, err := planAssets(p.install, plan)
	if err != nil {
		return 0, err
	}

	p.needs.SetMachine(siteID, plan.MachineID.String(), refs, wants...)

	v, err := p.next.Push(ctx, siteID, plan)
	if err != nil {
		return v, err
	}

	for !p.servesSigned(siteID, plan) {
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("site %s does not hold %s yet (being fetched): %w", siteID, plan.SignedURL, ctx.Err())
		case <-time.After(signedWaitPoll):
		}
	}

	return v, nil
}

// servesSigned reports whether the site can serve the plan's edge-local signed image (true when it names
// none, or one elsewhere).
func (p *assetAwarePusher) servesSigned(siteID string, plan bootplans.Plan) bool {
	name, local := strings.CutPrefix(plan.SignedURL, "/assets/")

	return !local || p.catalog == nil || p.catalog.Serves(siteID, name)
}

// planAssets are the assets a plan names: local install files by reference, upstream assets (kernel,
// initramfs, signed image, installer image) as wants of the library. Agent-mode plans count too: without
// agent images of its own (--agent-assets-dir) the controller resolves agent mode from these same sources.
func planAssets(install *assets.InstallFiles, plan bootplans.Plan) ([]*assetspb.AssetRef, []assets.Want, error) {
	if !plan.Mode.PXE() {
		return nil, nil, nil
	}

	refs, err := install.Refs(plan.MachineID.String(), plan.KernelURL, plan.InitrdURL, plan.SignedURL)
	if err != nil {
		return nil, nil, err
	}

	wants := assets.Boot{
		KernelURL: plan.KernelURL, InitrdURL: plan.InitrdURL, Installer: plan.Installer,
		UpstreamKernelURL: plan.UpstreamKernelURL, UpstreamInitrdURL: plan.UpstreamInitrdURL,
		SignedURL: plan.SignedURL, UpstreamSignedURL: plan.UpstreamSignedURL,
	}.Wants(plan.Arch.String())

	return refs, wants, nil
}

// Holds implements lifecycle.PlanPusher.
func (p *assetAwarePusher) Holds(siteID string, plan bootplans.Plan) bool {
	return p.next.Holds(siteID, plan) && p.servesSigned(siteID, plan)
}
