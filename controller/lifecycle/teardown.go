package lifecycle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/machines"
)

// teardown handles an InfraMachine's deletion: once the other lifecycle controllers have destroyed their own
// records and released their finalizers (so none of them acts on the machine any more), the machine's plan goes
// back to agent mode (best effort, so the machine rediscovers itself if it boots again) and what the controller
// remembers about it is dropped.
const teardownName = "lifecycle.TeardownController"

type teardown struct {
	gate  *planGate
	sites SiteLocator
	// watches and journal are optional (nil: none).
	watches *machines.WatchLists
	journal Journal
	// callTimeout bounds the plan's push; pollInterval is the wait for the other controllers' teardowns.
	callTimeout, pollInterval time.Duration
}

func newTeardownController(e *env, d Deps) *machineController {
	s := &teardown{gate: e.gate, sites: d.Sites, watches: d.Watches, journal: d.Journal, callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval}

	return newMachineController(e, teardownName, "", "", 0, s)
}

func (s *teardown) reconcile(context.Context, *zap.Logger, controller.QRuntime, *view) error {
	return nil
}

func (s *teardown) teardown(ctx context.Context, logger *zap.Logger, _ controller.QRuntime, v *view) error {
	for _, f := range v.finalizers {
		if f != teardownName && strings.HasPrefix(f, "lifecycle.") {
			return controller.NewRequeueInterval(s.pollInterval)
		}
	}

	if s.watches != nil {
		s.watches.Remove(v.id)
	}

	loc, ok := s.sites.Locate(v.id) // the observation record is gone by now
	if !ok {
		return nil
	}

	site := loc.SiteID

	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()

	plan, err := s.gate.plan(callCtx, site, v, true)
	if err != nil {
		return fmt.Errorf("agent plan of deleted %s: %w", v.id, err)
	}

	if err = s.gate.ensure(callCtx, site, plan); err != nil {
		return err
	}

	logger.Info("machine deleted from omni; left in agent mode", zap.String("site", site))
	note(s.journal, v.id, "lifecycle", "deleted from Omni; left in agent mode")

	return nil
}
