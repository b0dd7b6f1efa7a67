package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// reboot reboots a running machine when the user asked (a new requested reboot ID) or when it must work and
// runs the wrong thing: it should be in agent mode but its agent is not connected, or it should install but its
// agent is connected. Idle machines that need no power are never rebooted. Controller-decided reboots respect
// the cooldown; a network-booting reboot waits for the edge's acknowledgement of the plan and sets one-time PXE.
type reboot struct {
	noTeardown

	types   resources.Types
	written *written
	// load reads a machine's view again (its records, its BMC password opened) before the cycle.
	load    func(ctx context.Context, r controller.Reader, m *infra.Machine, reads records) (*view, error)
	gate    *planGate
	boot    *booter
	power   PowerClient
	intents *intentBook
	// outbox keeps power cycles done while their record could not be written (it outlives a rebuilt runtime).
	outbox *outbox
	// journal is optional (nil: none).
	journal Journal
	metrics *Metrics
	now     func() time.Time
	// cooldown and grace hold a machine in the wrong mode back (after a kick; while its agent may return);
	// callTimeout bounds each BMC call; pollInterval is the wait for what is outside the controller's hands.
	cooldown, grace, callTimeout, pollInterval time.Duration
}

func newRebootController(e *env, d Deps) *machineController {
	s := &reboot{
		types: d.Types, written: e.written, load: e.loadView, gate: e.gate, boot: e.boot, power: d.Power, intents: e.intents,
		outbox: e.outbox, journal: d.Journal, metrics: d.Metrics, now: d.Now, cooldown: e.cfg.Cooldown, grace: e.cfg.AgentReconnectGrace,
		callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval,
	}

	return newMachineController(e, "lifecycle.RebootController", d.Types.RebootStatus, d.Types.Namespace, ownRecords, s)
}

func (s *reboot) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	key := outboxKey("reboot", v.id)

	// A reboot carried out while its record could not be written (Omni went away) is recorded first, so the
	// same request or the cooldown it started is not lost and the machine is not power-cycled again.
	if rec, ok := s.outbox.get(key); ok {
		rs := rec.(*specs.RebootStatusSpec) // only reboots are kept here
		if err := s.record(ctx, r, v.id, key, rs); err != nil {
			return err
		}

		logger.Info("recorded a reboot done before the omni connection broke", zap.String("reason", rs.GetReason()))
		v.reboot = rs
	}

	// A power cycle left open (a crash, a cut) is settled with the edge before anything is decided: one it
	// carried out is recorded, not repeated.
	if in := v.reboot.GetOpenIntent(); in != nil {
		if settled, err := s.resume(ctx, logger, r, v, key, in); settled || err != nil {
			return err
		}
	}

	site, reason, wait := s.decide(v)
	if reason == "" {
		return wait
	}

	rs := &specs.RebootStatusSpec{}
	if v.reboot != nil {
		rs = proto.Clone(v.reboot).(*specs.RebootStatusSpec)
	}

	rs.Reason = reason
	if reason == reasonRequested {
		rs.LastRebootId = v.machine.GetRequestedRebootId()
	}

	plan, err := s.gate.plan(ctx, site, v, false)
	if err != nil {
		return failedCall(s.metrics, s.pollInterval, fmt.Errorf("plan of %s: %w", v.id, err))
	}

	if err = s.gate.ensure(ctx, site, plan); err != nil {
		return failedCall(s.metrics, s.pollInterval, err)
	}

	// The gate may have waited long (for the site to come back, for the edge's acknowledgement): what was
	// read before is stale. Decide again on fresh state and on the BMC's current word, and act on those.
	fresh, on, err := s.recheck(ctx, r, v, site, reason)
	if err != nil || fresh == nil {
		return err
	}

	if reason == reasonRequested {
		rs.LastRebootId = fresh.machine.GetRequestedRebootId()
	}

	switch {
	case on:
		callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
		defer cancel()

		how, err := s.boot.prepareBoot(callCtx, site, v.id, fresh.bmc, plan.Mode)
		if err != nil {
			return failedCall(s.metrics, s.pollInterval, err)
		}

		in := v.reboot.GetOpenIntent()
		if in == nil {
			if in, err = s.intend(ctx, r, v, rs, site); err != nil {
				return err
			}
		}

		err = s.power.Power(intentspb.NewOutgoingContext(callCtx, in.GetId()), site, v.id, fresh.bmc, machineaccess.PowerCycle)
		if err = s.intents.settle(ctx, v.id, in, err); err != nil {
			return s.failedIntent(ctx, r, v, key, in, err)
		}

		rs.LastReboot, rs.OpenIntent = timestamppb.New(s.now()), nil
		s.outbox.put(key, rs)

		logger.Info("rebooted", zap.String("site", site), zap.String("reason", rs.Reason), zap.String("mode", string(plan.Mode)))
		note(s.journal, v.id, "power", "rebooted into "+string(plan.Mode)+" mode"+how+": "+rs.Reason)
	case reason == reasonRequested:
		// Off after all: its next start is the fresh boot the user asked for; recorded so it is not repeated.
		logger.Info("reboot requested of a machine that is off: nothing to reboot", zap.String("site", site))
	default:
		// Off after all: powering it on into its plan is the power controller's work, not a reboot.
		return nil
	}

	return s.record(ctx, r, v.id, key, rs)
}

// resume settles an open power-cycle intent with the edge. settled is false when the step goes on deciding: the
// intent was carried out (recorded here; the cooldown it started applies), or it is still to be sent (not
// received at the edge, or running there: sent again under the same ID, which the edge carries out at most
// once).
func (s *reboot) resume(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view, key string, in *specs.IntentSpec) (bool, error) {
	done, err := s.intents.outcome(ctx, v.id, in)

	var closed *intentClosed

	switch {
	case done:
		rs := proto.Clone(v.reboot).(*specs.RebootStatusSpec)
		rs.LastReboot, rs.OpenIntent = timestamppb.New(s.now()), nil

		if err = s.record(ctx, r, v.id, key, rs); err != nil {
			return true, err
		}

		logger.Info("recorded a reboot the edge carried out before its answer was lost", zap.String("intent", in.GetId()))
		note(s.journal, v.id, "power", "rebooted ("+in.GetReason()+"): recorded after the answer was lost")

		// Decided afresh on the record (its cooldown starts now): nothing else wakes this step if the machine
		// still runs the wrong thing after the reboot.
		v.reboot = rs

		return false, nil
	case errors.As(err, &closed):
		return true, s.failedIntent(ctx, r, v, key, in, closed)
	case errors.Is(err, errIntentOpen):
		return false, nil
	default:
		return true, failedCall(s.metrics, s.pollInterval, fmt.Errorf("reboot %s: what became of power-cycle intent %s is not known yet: %w", v.id, in.GetId(), err))
	}
}

// intend writes a new power-cycle intent into the reboot record (rs as it will be once done), before the
// call is sent.
func (s *reboot) intend(ctx context.Context, r controller.QRuntime, v *view, rs *specs.RebootStatusSpec, site string) (*specs.IntentSpec, error) {
	in, err := s.intents.newIntent(intentPowerCycle, site, rs.GetLastRebootId(), rs.GetReason())
	if err != nil {
		return nil, err
	}

	open := &specs.RebootStatusSpec{}
	if v.reboot != nil {
		open = proto.Clone(v.reboot).(*specs.RebootStatusSpec)
	}

	open.OpenIntent = in

	if err = s.write(ctx, r, v, open); err != nil {
		return nil, failedCall(s.metrics, s.pollInterval, fmt.Errorf("record the power-cycle intent of %s: %w", v.id, err))
	}

	return in, nil
}

// failedIntent handles a power cycle that did not finish: an intent the edge closed is cleared (interrupted:
// the machine may have been cycled or not, which its next observation tells; it is not cycled again for it),
// any other failure leaves it open. The step is retried after the pause a failure sets.
func (s *reboot) failedIntent(ctx context.Context, r controller.QRuntime, v *view, key string, in *specs.IntentSpec, err error) error {
	var closed *intentClosed
	if errors.As(err, &closed) {
		rs := proto.Clone(v.reboot).(*specs.RebootStatusSpec)
		rs.OpenIntent = nil

		if closed.state == intentspb.State_STATE_INTERRUPTED {
			// Counted as done: the cooldown starts and a requested reboot is not repeated.
			rs.LastReboot = timestamppb.New(s.now())
			if in.GetCause() != "" {
				rs.LastRebootId = in.GetCause()
			}

			s.intents.alert(v.id, "the edge restarted during a power cycle (intent "+in.GetId()+"): whether the machine was cycled is unknown; not cycled again for it")
		}

		if werr := s.record(ctx, r, v.id, key, rs); werr != nil {
			return failedCall(s.metrics, s.pollInterval, fmt.Errorf("clear the power-cycle intent of %s: %w", v.id, werr))
		}
	}

	return failedCall(s.metrics, s.pollInterval, fmt.Errorf("reboot %s at site %s: %w", v.id, in.GetSiteId(), err))
}

// write writes the reboot record rs (not kept in the outbox: it records no action) and updates the view.
func (s *reboot) write(ctx context.Context, r controller.QRuntime, v *view, rs *specs.RebootStatusSpec) error {
	err := writeOwn(ctx, s.written, r, s.types.NewRebootStatus(v.id), v.reboot, rs, func(res *resources.RebootStatus) {
		res.TypedSpec().Value = rs
	})
	if err == nil {
		v.reboot = rs
	}

	return err
}

// record writes the reboot status and drops it from the outbox.
func (s *reboot) record(ctx context.Context, r controller.QRuntime, id, key string, rs *specs.RebootStatusSpec) error {
	if err := writeOwn(ctx, s.written, r, s.types.NewRebootStatus(id), nil, rs, func(res *resources.RebootStatus) {
		res.TypedSpec().Value = rs
	}); err != nil {
		return fmt.Errorf("record reboot: %w", err)
	}

	s.outbox.done(key, rs)

	return nil
}

// Reboot reasons recorded in RebootStatus.
const (
	reasonRequested = "requested"
	reasonWrongMode = "wrong-mode"
)

// decide tells whether v must be rebooted now and why; with no reason, wait is what reconcile returns
// (nil, or a requeue while the cooldown runs).
func (s *reboot) decide(v *view) (site, reason string, wait error) {
	if !v.managed() || !v.bmcConfigured() || v.powerOffActive() || v.powerState() != specs.MachineObservationSpec_POWER_STATE_ON {
		return "", "", nil
	}

	site, ok := v.site()
	if !ok {
		return "", "", nil
	}

	switch req := v.machine.GetRequestedRebootId(); {
	case req != "" && req != v.reboot.GetLastRebootId():
		return site, reasonRequested, nil
	case v.requiresPowerOn() && wrongMode(v):
		if left := max(cooldownLeft(v, s.cooldown, s.now), agentGraceLeft(v, s.grace, s.now)); left > 0 {
			return "", "", controller.NewRequeueInterval(min(left, s.pollInterval))
		}

		return site, reasonWrongMode, nil
	default:
		return "", "", nil
	}
}

// recheck re-reads the machine and its state and asks the BMC whether it is on. fresh is nil when the same
// decision no longer holds (the next reconcile decides afresh); otherwise on is the BMC's word.
func (s *reboot) recheck(ctx context.Context, r controller.QRuntime, v *view, site, reason string) (fresh *view, on bool, err error) {
	m, err := safe.ReaderGetByID[*infra.Machine](ctx, r, v.id)
	if err != nil {
		return nil, false, fmt.Errorf("read infra machine again: %w", err)
	}

	fresh, err = s.load(ctx, r, m, ownRecords)
	if err != nil {
		return nil, false, err
	}

	if freshSite, freshReason, _ := s.decide(fresh); freshSite != site || freshReason != reason {
		return nil, false, controller.NewRequeueInterval(s.pollInterval)
	}

	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()

	ps, err := s.power.PowerStatus(callCtx, site, v.id, fresh.bmc)
	if err != nil {
		return nil, false, failedCall(s.metrics, s.pollInterval, fmt.Errorf("power status of %s at site %s before a reboot: %w", v.id, site, err))
	}

	return fresh, ps == machines.PowerOn, nil
}

// wrongMode: the machine should run the agent but its agent is not connected, or should install Talos but its
// agent is connected. "In agent mode" is decided from the agent being connected, never from what was served.
func wrongMode(v *view) bool {
	switch v.mode() {
	case bootplans.ModeAgent:
		return !v.agentConnected()
	case bootplans.ModeInstall:
		return v.agentConnected()
	default:
		return false
	}
}
