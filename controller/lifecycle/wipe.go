package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// wipe wipes a machine's disks through its agent on acceptance and whenever Omni sets a new wipe ID, and
// records the wipe (with the install counter and node token at that time) in WipeStatus.
type wipe struct {
	noTeardown

	types   resources.Types
	written *written
	agent   AgentClient
	intents *intentBook
	// outbox keeps wipes done while their record could not be written; jobs are the wipes running; due
	// schedules the next look once one ends. All three outlive a rebuilt runtime.
	outbox *outbox
	jobs   *jobs
	due    *dues
	// policies are the sites' own wipe methods (optional: the controller's for all); journal is optional too.
	policies *machines.SitePolicies
	journal  Journal
	metrics  *Metrics
	now      func() time.Time
	// method is the controller's wipe method; the timeouts bound a fast and a zeroes wipe; pollInterval is the
	// wait for what is outside the controller's hands.
	method                               machines.WipeMethod
	timeout, zeroesTimeout, pollInterval time.Duration
}

const wipeName = "lifecycle.WipeController"

func newWipeController(e *env, d Deps) *machineController {
	s := &wipe{
		types: d.Types, written: e.written, agent: d.Agent, intents: e.intents, outbox: e.outbox, jobs: e.jobs, due: e.due,
		policies: d.SitePolicies, journal: d.Journal, metrics: d.Metrics, now: d.Now, method: e.cfg.WipeMethod,
		timeout: e.cfg.WipeTimeout, zeroesTimeout: e.cfg.ZeroesWipeTimeout, pollInterval: e.cfg.PollInterval,
	}

	return callsEdge(newMachineController(e, wipeName, d.Types.WipeStatus, d.Types.Namespace, bmcRecord|wipeRecord|observationRecord, s))
}

func (s *wipe) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	key := outboxKey("wipe", v.id)

	// A wipe that finished while its record could not be written (Omni went away) is recorded, not repeated.
	if rec, ok := s.outbox.get(key); ok {
		if w := rec.(*specs.WipeStatusSpec); w.GetLastWipeId() == v.machine.GetWipeId() { // only wipes are kept here
			return s.record(ctx, logger, r, v.id, w, "recorded a wipe done before the omni connection broke")
		}
	}

	if !v.managed() || !v.bmcConfigured() || !v.requiresWipe() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return waitFor(logger, "machine not seen at any site", s.pollInterval)
	}

	// An intent left open (a crash, a cut) is settled with the edge first, agent or not: a wipe it carried out
	// is recorded, not repeated.
	in, settled, err := s.resume(ctx, logger, r, v, site)
	if settled || err != nil {
		return err
	}

	if !v.agentConnected() {
		return waitFor(logger, "wipe waits for the agent", s.pollInterval) // the reboot controller brings it to agent mode
	}

	if in == nil {
		if in, err = s.intend(ctx, r, v, site); err != nil {
			return err
		}
	}

	// The wipe runs apart from this reconcile: when the runtime is rebuilt meanwhile (Omni restarted), it goes
	// on, and the next reconcile joins it rather than wiping again.
	zeroes, timeout := in.GetReason() == string(machines.WipeZeroes), s.timeout
	if zeroes {
		timeout = s.zeroesTimeout
	}

	jb := s.jobs.start(ctx, key, in.GetId(), timeout, func(ctx context.Context) error {
		logger.Info("wiping disks", zap.String("site", site), zap.String("wipe_id", in.GetCause()), zap.String("intent", in.GetId()), zap.Bool("zeroes", zeroes))
		note(s.journal, v.id, "wipe-started", "wiping disks ("+in.GetReason()+")")

		err := s.agent.WipeDisks(intentspb.NewOutgoingContext(ctx, in.GetId()), site, v.id, zeroes)
		// The far end's deadline (the call's own, propagated) may end it a moment before this one's.
		if err != nil && (errors.Is(ctx.Err(), context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
			err = stated(err, fmt.Sprintf("no answer within %s, the %s wipe's timeout", timeout, in.GetReason()))
		}

		if err = s.intents.settle(ctx, v.id, in, err); err != nil {
			return err
		}

		s.outbox.put(key, wipeDone(in, s.now()))

		return nil
	}, func(err error) {
		if err == nil {
			s.due.after(wipeName, v.id, 0)
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

	s.jobs.collect(jb)

	if jb.err != nil {
		return s.failedIntent(ctx, r, v, in, jb.err)
	}

	rec, ok := s.outbox.get(key)
	if !ok {
		return controller.NewRequeueInterval(time.Second) // recorded by a concurrent reconcile meanwhile
	}

	return s.record(ctx, logger, r, v.id, rec.(*specs.WipeStatusSpec), "disks wiped") // only wipes are kept here
}

// resume returns the intent open in the record when it serves the wipe Omni asks for now and is still to be
// sent (not received at the edge, or running there: sent again under the same ID, carried out at most once).
// settled is true when the step is done for now: the edge carried it out (recorded here) or closed it
// (cleared, retried after a pause), or the edge could not be asked.
func (s *wipe) resume(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view, site string) (in *specs.IntentSpec, settled bool, err error) {
	in = v.wipe.GetOpenIntent()
	if in == nil || in.GetCause() != v.machine.GetWipeId() {
		return nil, false, nil // none, or for a wipe Omni no longer asks for: a new intent replaces it
	}

	if s.jobs.has(outboxKey("wipe", v.id), in.GetId()) {
		return in, false, nil // this process sent it: join it
	}

	done, err := s.intents.outcome(ctx, v.id, in)

	var closed *intentClosed

	switch {
	case done:
		return nil, true, s.record(ctx, logger, r, v.id, wipeDone(in, s.now()), "recorded a wipe the edge carried out before its answer was lost")
	case errors.As(err, &closed):
		return nil, true, s.failedIntent(ctx, r, v, in, closed)
	case errors.Is(err, errIntentOpen):
		return in, false, nil
	default:
		return nil, true, failedCall(s.metrics, s.pollInterval, fmt.Errorf("wipe %s at site %s: what became of wipe intent %s is not known yet: %w", v.id, site, in.GetId(), err))
	}
}

// intend writes a new wipe intent to the record, before anything is sent.
func (s *wipe) intend(ctx context.Context, r controller.QRuntime, v *view, site string) (*specs.IntentSpec, error) {
	in, err := s.intents.newIntent(intentWipe, site, v.machine.GetWipeId(), string(s.policies.WipeMethod(site, s.method)))
	if err != nil {
		return nil, err
	}

	in.InstallEventId, in.NodeUniqueToken = v.machine.GetInstallEventId(), v.machine.GetNodeUniqueToken()

	if err = s.writeIntent(ctx, r, v, in); err != nil {
		return nil, failedCall(s.metrics, s.pollInterval, fmt.Errorf("record the wipe intent of %s: %w", v.id, err))
	}

	return in, nil
}

// writeIntent writes the wipe record with open (nil: none) as its open intent, the rest as it was.
func (s *wipe) writeIntent(ctx context.Context, r controller.QRuntime, v *view, open *specs.IntentSpec) error {
	rec := &specs.WipeStatusSpec{}
	if v.wipe != nil {
		rec = proto.Clone(v.wipe).(*specs.WipeStatusSpec)
	}

	rec.OpenIntent = open

	err := writeOwn(ctx, s.written, r, s.types.NewWipeStatus(v.id), v.wipe, rec, func(res *resources.WipeStatus) {
		res.TypedSpec().Value = rec
	})
	if err == nil {
		v.wipe = rec
	}

	return err
}

// failedIntent handles a wipe that did not finish: an intent the edge closed (failed, or interrupted by an
// edge restart) is cleared from the record, so the next try is a new intent; any other failure leaves it open.
// Either way the step is retried after the pause a failure sets.
func (s *wipe) failedIntent(ctx context.Context, r controller.QRuntime, v *view, in *specs.IntentSpec, err error) error {
	var closed *intentClosed
	if errors.As(err, &closed) {
		if closed.state == intentspb.State_STATE_INTERRUPTED {
			s.intents.alert(v.id, "the edge restarted while wiping (intent "+in.GetId()+"): whether the disks were wiped is unknown; wiping again")
		}

		if werr := s.writeIntent(ctx, r, v, nil); werr != nil {
			return failedCall(s.metrics, s.pollInterval, fmt.Errorf("clear the wipe intent of %s: %w", v.id, werr))
		}
	}

	return failedCall(s.metrics, s.pollInterval, fmt.Errorf("wipe %s at site %s: %w", v.id, in.GetSiteId(), err))
}

// wipeDone is the record of a wipe carried out under intent in.
func wipeDone(in *specs.IntentSpec, now time.Time) *specs.WipeStatusSpec {
	return &specs.WipeStatusSpec{
		LastWipeId:           in.GetCause(),
		InstallEventIdAtWipe: in.GetInstallEventId(),
		WipedNodeUniqueToken: in.GetNodeUniqueToken(),
		WipedAt:              timestamppb.New(now),
	}
}

// record writes a finished wipe to WipeStatus and drops it from the outbox.
func (s *wipe) record(ctx context.Context, logger *zap.Logger, r controller.QRuntime, id string, w *specs.WipeStatusSpec, msg string) error {
	if err := writeOwn(ctx, s.written, r, s.types.NewWipeStatus(id), nil, w, func(res *resources.WipeStatus) {
		res.TypedSpec().Value = w
	}); err != nil {
		return fmt.Errorf("record wipe: %w", err)
	}

	s.outbox.done(outboxKey("wipe", id), w)
	logger.Info(msg, zap.String("wipe_id", w.GetLastWipeId()))
	note(s.journal, id, "wipe-finished", msg)

	return nil
}
