package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/machines"
)

// planGate computes a machine's plan and makes sure its edge holds it before an operation that depends on it
// (power-on, reboot) runs. What each edge acknowledged is the pusher's to know (the sites' boot tables); the
// gate keeps nothing of its own.
type planGate struct {
	sites SiteLocator
	// policies say what sites' operators set for their machines' Secure Boot (nil: nothing).
	policies *machines.SitePolicies
	// reach says how each site's machines reach its edge (nil: nobody says), for signed images.
	reach   SiteReach
	planner Planner
	pusher  PlanPusher
	// timeout bounds the wait for an acknowledgement (an offline site is retried later, not waited for).
	timeout time.Duration
}

func newPlanGate(sites SiteLocator, policies *machines.SitePolicies, reach SiteReach, planner Planner, p PlanPusher, timeout time.Duration) *planGate {
	return &planGate{sites: sites, policies: policies, reach: reach, planner: planner, pusher: p, timeout: timeout}
}

// ensure returns once site's edge acknowledged plan for its machine (at once when it already had).
func (g *planGate) ensure(ctx context.Context, site string, plan bootplans.Plan) error {
	if g.pusher.Holds(site, plan) {
		return nil
	}

	pushCtx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()

	if _, err := g.pusher.Push(pushCtx, site, plan); err != nil {
		return fmt.Errorf("push %s plan of %s to site %s: %w", plan.Mode, plan.MachineID, site, err)
	}

	return nil
}

// plan computes the machine's plan at site, for the architecture its network boot reported, with its Secure
// Boot as known (Location.EnforcesSecureBoot) and its edge's reach (baked into signed images).
func (g *planGate) plan(ctx context.Context, site string, v *view, deleting bool) (bootplans.Plan, error) {
	in := v.planInput(deleting)

	var macs []string

	if loc, ok := g.sites.Locate(v.id); ok {
		in.Arch = loc.Arch
		in.SecureBoot, _ = loc.EnforcesSecureBoot(g.policies.SecureBoot(loc.SiteID))
		macs = loc.MACs

		if g.reach != nil {
			in.Reach = g.reach.Reach(loc.SiteID)
		}
	}

	plan, err := g.planner.Plan(ctx, in)
	if err != nil {
		return plan, err
	}

	// the machine's interfaces go with its plan: the edge knows it by MAC before its UUID (DHCP)
	plan.MACs = slices.Clone(macs)

	return plan, nil
}
