package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outpost-metal/outpost/controller/bootplans"
)

// planGate pushes boot plans and remembers what each machine's edge acknowledged, so that an operation that
// depends on a plan (power-on, reboot) runs only after the edge holds it, and an unchanged plan is not re-sent.
type planGate struct {
	pusher PlanPusher
	// timeout bounds the wait for an acknowledgement (an offline site is retried later, not waited for).
	timeout time.Duration

	mu    sync.Mutex
	acked map[string]ackedPlan // by machine ID
}

type ackedPlan struct {
	site string
	plan bootplans.Plan
}

func newPlanGate(p PlanPusher, timeout time.Duration) *planGate {
	return &planGate{pusher: p, timeout: timeout, acked: map[string]ackedPlan{}}
}

// ensure returns once site's edge acknowledged plan for its machine (at once when it already had).
func (g *planGate) ensure(ctx context.Context, site string, plan bootplans.Plan) error {
	g.mu.Lock()
	last, ok := g.acked[plan.MachineID]
	g.mu.Unlock()

	if ok && last.site == site && last.plan.Equal(plan) {
		return nil
	}

	pushCtx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()

	_, err := g.pusher.Push(pushCtx, site, plan)
	if err != nil {
		return fmt.Errorf("push %s plan of %s to site %s: %w", plan.Mode, plan.MachineID, site, err)
	}

	g.mu.Lock()
	g.acked[plan.MachineID] = ackedPlan{site: site, plan: plan}
	g.mu.Unlock()

	return nil
}

// forget drops what is known about a machine (deleted), so a returning machine gets its plan again.
func (g *planGate) forget(machineID string) {
	g.mu.Lock()
	delete(g.acked, machineID)
	g.mu.Unlock()
}
