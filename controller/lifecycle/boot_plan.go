package lifecycle

import (
	"context"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
)

// bootPlan keeps every machine's boot plan at its site's edge current (agent, install, disk or deny), so the edge
// answers correctly even when no power action is due (a rejected machine is denied at once). Cordoned machines
// are left alone.
type bootPlan struct {
	noTeardown

	env *env
}

func newBootPlanController(e *env) *machineController {
	return newMachineController(e, "lifecycle.BootPlanController", "", "", bmcRecord|wipeRecord|observationRecord, &bootPlan{env: e})
}

func (s *bootPlan) reconcile(ctx context.Context, logger *zap.Logger, _ controller.QRuntime, v *view) error {
	if v.machine.GetCordoned() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return s.env.waitFor(logger, "machine not seen at any site")
	}

	{
		plan, err := s.env.plan(ctx, site, v, false)
		if err != nil {
			return s.env.failed(err)
		}

		if err = s.env.gate.ensure(ctx, site, plan); err != nil {
			return s.env.failed(err)
		}
	}

	return nil
}
