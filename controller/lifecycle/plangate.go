package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/outpost-metal/outpost/controller/bootplans"
)

// planGate makes sure a machine's edge holds its plan before an operation that depends on it (power-on,
// reboot) runs. What each edge acknowledged is the pusher's to know (the sites' boot tables); the gate keeps
// nothing of its own.
type planGate struct {
	pusher PlanPusher
	// timeout bounds the wait for an acknowledgement (an offline site is retried later, not waited for).
	timeout time.Duration
}

func newPlanGate(p PlanPusher, timeout time.Duration) *planGate {
	return &planGate{pusher: p, timeout: timeout}
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
