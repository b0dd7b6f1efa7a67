package lifecycle

import (
	"context"
	"fmt"
	"strings"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
)

// teardown handles an InfraMachine's deletion: once the other lifecycle controllers have destroyed their own
// records and released their finalizers (so none of them acts on the machine any more), the machine's plan goes
// back to agent mode (best effort, so the machine rediscovers itself if it boots again) and what the controller
// remembers about it is dropped.
const teardownName = "lifecycle.TeardownController"

type teardown struct {
	env *env
}

func newTeardownController(e *env) *machineController {
	return newMachineController(e, teardownName, "", "", 0, &teardown{env: e})
}

func (s *teardown) reconcile(context.Context, *zap.Logger, controller.QRuntime, *view) error {
	return nil
}

func (s *teardown) teardown(ctx context.Context, logger *zap.Logger, _ controller.QRuntime, v *view) error {
	for _, f := range v.finalizers {
		if f != teardownName && strings.HasPrefix(f, "lifecycle.") {
			return controller.NewRequeueInterval(s.env.cfg.PollInterval)
		}
	}

	if s.env.Watches != nil {
		s.env.Watches.Remove(v.id)
	}

	loc, ok := s.env.Sites.Locate(v.id) // the observation record is gone by now
	if !ok {
		return nil
	}

	site := loc.SiteID

	callCtx, cancel := context.WithTimeout(ctx, s.env.cfg.CallTimeout)
	defer cancel()

	plan, err := s.env.plan(callCtx, site, v, true)
	if err != nil {
		return fmt.Errorf("agent plan of deleted %s: %w", v.id, err)
	}

	if err = s.env.gate.ensure(callCtx, site, plan); err != nil {
		return err
	}

	logger.Info("machine deleted from omni; left in agent mode", zap.String("site", site))
	s.env.note(v.id, "lifecycle", "deleted from Omni; left in agent mode")

	return nil
}
