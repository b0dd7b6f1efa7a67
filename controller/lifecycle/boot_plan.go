package lifecycle

import (
	"context"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
)

// bootPlan keeps every machine's boot plan at its site's edge current (agent, install, disk or deny), so the edge
// answers correctly even when no power action is due (a rejected machine is denied at once). Cordoned machines
// are left alone.
type bootPlan struct {
	noTeardown

	gate    *planGate
	metrics *Metrics
	// pollInterval is the wait for a machine not located, and the retry after a failed push.
	pollInterval time.Duration
}

func newBootPlanController(e *env, d Deps) *machineController {
	s := &bootPlan{gate: e.gate, metrics: d.Metrics, pollInterval: e.cfg.PollInterval}

	return newMachineController(e, "lifecycle.BootPlanController", "", "", bmcRecord|wipeRecord|observationRecord, s)
}

func (s *bootPlan) reconcile(ctx context.Context, logger *zap.Logger, _ controller.QRuntime, v *view) error {
	if v.machine.GetCordoned() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return waitFor(logger, "machine not seen at any site", s.pollInterval)
	}

	{
		plan, err := s.gate.plan(ctx, site, v, false)
		if err != nil {
			return failedCall(s.metrics, s.pollInterval, err)
		}

		if err = s.gate.ensure(ctx, site, plan); err != nil {
			return failedCall(s.metrics, s.pollInterval, err)
		}
	}

	return nil
}
