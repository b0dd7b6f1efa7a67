package lifecycle

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
)

// teardown handles an InfraMachine's deletion: the machine's plan goes back to agent mode (best effort, so the
// machine rediscovers itself if it boots again) and what the controller remembers about it is dropped. The other
// controllers destroy their own records, each holding its finalizer on the InfraMachine until then.
type teardown struct {
	env *env
}

func newTeardownController(e *env) *machineController {
	return newMachineController(e, "lifecycle.TeardownController", "", "", &teardown{env: e})
}

func (s *teardown) reconcile(context.Context, *zap.Logger, controller.QRuntime, *view) error {
	return nil
}

func (s *teardown) teardown(ctx context.Context, logger *zap.Logger, _ controller.QRuntime, v *view) error {
	defer s.env.gate.forget(v.id)

	site, ok := v.site()
	if !ok {
		return nil
	}

	callCtx, cancel := context.WithTimeout(ctx, s.env.cfg.CallTimeout)
	defer cancel()

	plan, err := s.env.Planner.Plan(callCtx, site, v.planInput(true))
	if err != nil {
		return fmt.Errorf("agent plan of deleted %s: %w", v.id, err)
	}

	if err = s.env.gate.ensure(callCtx, site, plan); err != nil {
		return err
	}

	logger.Info("machine deleted from omni; left in agent mode", zap.String("site", site))

	return nil
}
