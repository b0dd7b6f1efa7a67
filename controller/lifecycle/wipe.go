package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// wipe wipes a machine's disks through its agent on acceptance and whenever Omni sets a new wipe ID, and
// records the wipe (with the install counter and node token at that time) in WipeStatus.
type wipe struct {
	noTeardown

	env *env
}

const wipeName = "lifecycle.WipeController"

func newWipeController(e *env) *machineController {
	return callsEdge(newMachineController(e, wipeName, e.Types.WipeStatus, e.Types.Namespace, bmcRecord|wipeRecord|observationRecord, &wipe{env: e}))
}

func (s *wipe) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	key := outboxKey("wipe", v.id)

	// A wipe that finished while its record could not be written (Omni went away) is recorded, not repeated.
	if rec, ok := s.env.outbox.get(key); ok {
		if w := rec.(*specs.WipeStatusSpec); w.GetLastWipeId() == v.machine.GetWipeId() { // only wipes are kept here
			return s.record(ctx, logger, r, v.id, w, "recorded a wipe done before the omni connection broke")
		}
	}

	if !v.managed() || !v.bmcConfigured() || !v.requiresWipe() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return s.env.waitFor(logger, "machine not seen at any site")
	}

	if !v.agentConnected() {
		return s.env.waitFor(logger, "wipe waits for the agent") // the reboot controller brings it to agent mode
	}

	wipeID, installEvents, token := v.machine.GetWipeId(), v.machine.GetInstallEventId(), v.machine.GetNodeUniqueToken()

	// The wipe runs apart from this reconcile: when the runtime is rebuilt meanwhile (Omni restarted), it goes
	// on, and the next reconcile joins it rather than wiping again.
	method := s.env.SitePolicies.WipeMethod(site, s.env.cfg.WipeMethod)
	zeroes, timeout := method == "zeroes", s.env.cfg.WipeTimeout
	if zeroes {
		timeout = s.env.cfg.ZeroesWipeTimeout
	}

	jb := s.env.jobs.start(ctx, key, wipeID, timeout, func(ctx context.Context) error {
		logger.Info("wiping disks", zap.String("site", site), zap.String("wipe_id", wipeID), zap.Bool("zeroes", zeroes))
		s.env.note(v.id, "wipe-started", "wiping disks ("+method+")")

		if err := s.env.Agent.WipeDisks(ctx, site, v.id, zeroes); err != nil {
			return err
		}

		s.env.outbox.put(key, &specs.WipeStatusSpec{
			LastWipeId:           wipeID,
			InstallEventIdAtWipe: installEvents,
			WipedNodeUniqueToken: token,
			WipedAt:              timestamppb.New(s.env.Now()),
		})

		return nil
	}, func(err error) {
		if err == nil {
			s.env.due.after(wipeName, v.id, 0)
		}
	})

	// The reconcile waits for the wipe (a wipe done also puts the machine back in this controller's queue, for
	// a reconcile that stopped waiting when the runtime was rebuilt; a failed one is tried again after the
	// pause its failure sets, see requeue: putting it back at once tried a wipe broken by an uplink cut
	// 6,891-10,255 times a second until the agent was seen gone). Not waiting, and recording the wipe from
	// that next reconcile, recorded no wipe at all in 10 minutes at 20,000 machines in the fleet simulator
	// (against 342 with the wait); until that is understood, a long wipe holds one worker.
	select {
	case <-jb.done:
	case <-ctx.Done():
		return ctx.Err()
	}

	s.env.jobs.collect(jb)

	if jb.err != nil {
		return s.env.failed(fmt.Errorf("wipe %s at site %s: %w", v.id, site, jb.err))
	}

	rec, ok := s.env.outbox.get(key)
	if !ok {
		return controller.NewRequeueInterval(time.Second) // recorded by a concurrent reconcile meanwhile
	}

	return s.record(ctx, logger, r, v.id, rec.(*specs.WipeStatusSpec), "disks wiped") // only wipes are kept here
}

// record writes a finished wipe to WipeStatus and drops it from the outbox.
func (s *wipe) record(ctx context.Context, logger *zap.Logger, r controller.QRuntime, id string, w *specs.WipeStatusSpec, msg string) error {
	if err := writeOwn(ctx, s.env, r, s.env.Types.NewWipeStatus(id), nil, w, func(res *resources.WipeStatus) {
		res.TypedSpec().Value = w
	}); err != nil {
		return fmt.Errorf("record wipe: %w", err)
	}

	s.env.outbox.done(outboxKey("wipe", id), w)
	logger.Info(msg, zap.String("wipe_id", w.GetLastWipeId()))
	s.env.note(id, "wipe-finished", msg)

	return nil
}
