package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/machineaccess"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// power makes a machine's power follow its work: on when it must work (allocated, installed or a wipe pending)
// or Omni prefers it on, off when idle and preferred off, after the cooldown. A user power-off request is
// honoured at once and never undone while it is active. A power-on that network boots waits until the edge
// acknowledged the plan it boots into, then sets a one-time PXE boot.
//
// A BMC that did not answer is not asked again for the same wish while the machine's observation says its
// power state is unknown (the edge's watch cannot reach it either): each call would hold a worker for the
// whole call timeout, every retry, ahead of every other machine's request. A new wish (a user's request, a
// machine that must now work) gets one try at once; the BMC answering its watch again (the observation
// changes) wakes this controller to try again.
type power struct {
	boot    *booter
	power   PowerClient
	types   resources.Types
	written *written
	metrics *Metrics
	now     func() time.Time
	// journal is optional (nil: none).
	journal Journal
	// cooldown is the least time between a power-on and a power-off; callTimeout bounds each BMC call;
	// pollInterval is the wait for what is outside the controller's hands.
	cooldown, callTimeout, pollInterval time.Duration

	// unanswered is, per machine, the wish whose BMC call failed last (powerWish).
	mu         sync.Mutex
	unanswered map[string]string
}

func newPowerController(e *env, d Deps) *machineController {
	s := &power{
		boot: e.boot, power: d.Power, types: d.Types, written: e.written, metrics: d.Metrics, now: d.Now, journal: d.Journal,
		cooldown: e.cfg.Cooldown, callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval, unanswered: map[string]string{},
	}

	return callsEdge(newMachineController(e, "lifecycle.PowerController", d.Types.PowerOperation, d.Types.Namespace, ownRecords, s))
}

// powerWish names what the power step wants of a machine's BMC, to tell a new wish from one already tried.
func powerWish(newRequest bool, request string, wantOn bool) string {
	switch {
	case newRequest:
		return "power-off request " + request
	case wantOn:
		return "on"
	default:
		return "off"
	}
}

func (s *power) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	if !v.managed() || !v.bmcConfigured() {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return waitFor(logger, "machine not seen at any site", s.pollInterval)
	}

	req := v.machine.GetPowerOffRequestId()
	newRequest := req != "" && v.power.GetPowerOffRequestId() != req

	wantOn := !newRequest && !v.powerOffActive() && (v.requiresPowerOn() || v.preferredOn())
	wantOff := newRequest || (!v.requiresPowerOn() && !v.preferredOn() && !v.powerOffActive())

	if !wantOn && !wantOff {
		s.tried(v.id, "", nil)

		return nil
	}

	wish := powerWish(newRequest, req, wantOn)

	s.mu.Lock()
	unanswered := s.unanswered[v.id] == wish
	s.mu.Unlock()

	if unanswered && v.powerState() == specs.MachineObservationSpec_POWER_STATE_UNKNOWN {
		s.metrics.inc(ReasonBMCNotAnswering)

		return waitFor(logger, "bmc did not answer, nor its edge's watch since", s.pollInterval)
	}

	err := s.act(ctx, logger, r, v, site, newRequest, wantOn, wantOff)
	s.tried(v.id, wish, err)

	return err
}

// tried keeps whether the wish's BMC call failed (an edge call's failure is a requeue carrying its error).
func (s *power) tried(id, wish string, err error) {
	var rq *controller.RequeueError

	s.mu.Lock()
	defer s.mu.Unlock()

	if errors.As(err, &rq) && rq.Err() != nil {
		s.unanswered[id] = wish
	} else {
		delete(s.unanswered, id)
	}
}

// teardown forgets the machine's unanswered wish.
func (s *power) teardown(_ context.Context, _ *zap.Logger, _ controller.QRuntime, v *view) error {
	s.tried(v.id, "", nil)

	return nil
}

// act asks the BMC for its power state and does what the wish needs of it.
func (s *power) act(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view, site string, newRequest, wantOn, wantOff bool) error {
	op := &specs.PowerOperationSpec{}
	if v.power != nil {
		op = proto.Clone(v.power).(*specs.PowerOperationSpec)
	}

	req := v.machine.GetPowerOffRequestId()

	// decide on the BMC's current word, not on the last observation
	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()

	ps, err := s.power.PowerStatus(callCtx, site, v.id, v.bmc)
	if err != nil {
		return failedCall(s.metrics, s.pollInterval, fmt.Errorf("power status of %s at site %s: %w", v.id, site, err))
	}

	switch {
	case newRequest:
		if ps != machines.PowerOff {
			if err = s.power.Power(callCtx, site, v.id, v.bmc, machineaccess.PowerOff); err != nil {
				return failedCall(s.metrics, s.pollInterval, fmt.Errorf("power off %s at site %s (user request): %w", v.id, site, err))
			}

			op.LastPowerOff = timestamppb.New(s.now())
		}

		op.PowerOffRequestId = req
		op.PowerOffWipeId = v.machine.GetWipeId()

		logger.Info("power-off request honoured", zap.String("site", site), zap.String("request", req))
		note(s.journal, v.id, "power", "powered off on the user's request")
	case wantOn && ps == machines.PowerOff:
		if err = s.boot.powerOnInto(ctx, logger, site, v); err != nil {
			return err
		}

		op.LastPowerOn = timestamppb.New(s.now())
	case wantOff && ps == machines.PowerOn:
		if left := cooldownLeft(v, s.cooldown, s.now); left > 0 {
			return controller.NewRequeueInterval(min(left, s.pollInterval))
		}

		if err = s.power.Power(callCtx, site, v.id, v.bmc, machineaccess.PowerOff); err != nil {
			return failedCall(s.metrics, s.pollInterval, fmt.Errorf("power off idle %s at site %s: %w", v.id, site, err))
		}

		op.LastPowerOff = timestamppb.New(s.now())

		logger.Info("powered off idle machine", zap.String("site", site))
		note(s.journal, v.id, "power", "powered off (idle)")
	default:
		return nil
	}

	if err = writeOwn(ctx, s.written, r, s.types.NewPowerOperation(v.id), v.power, op, func(p *resources.PowerOperation) {
		p.TypedSpec().Value = op
	}); err != nil {
		return fmt.Errorf("record power operation: %w", err)
	}

	return nil
}

// booter boots a machine into its plan: it has the plan pushed, readies the next boot (a one-time network
// boot, virtual media, an ejected image) and powers the machine on. The power and reboot steps share it.
type booter struct {
	gate  *planGate
	power PowerClient
	// policies say which sites boot from virtual media (optional: none); journal is optional too.
	policies *machines.SitePolicies
	journal  Journal
	metrics  *Metrics
	// callTimeout bounds the calls of one boot; pollInterval is the retry after a failed one.
	callTimeout, pollInterval time.Duration
}

// powerOnInto pushes the machine's plan, waits for the edge's acknowledgement, prepares the boot
// (prepareBoot) and powers the machine on.
func (b *booter) powerOnInto(ctx context.Context, logger *zap.Logger, site string, v *view) error {
	plan, err := b.gate.plan(ctx, site, v, false)
	if err != nil {
		return failedCall(b.metrics, b.pollInterval, fmt.Errorf("plan of %s: %w", v.id, err))
	}

	if err = b.gate.ensure(ctx, site, plan); err != nil {
		return failedCall(b.metrics, b.pollInterval, err)
	}

	callCtx, cancel := context.WithTimeout(ctx, b.callTimeout)
	defer cancel()

	how, err := b.prepareBoot(callCtx, site, v.id, v.bmc, plan.Mode)
	if err != nil {
		return failedCall(b.metrics, b.pollInterval, err)
	}

	if err = b.power.Power(callCtx, site, v.id, v.bmc, machineaccess.PowerOn); err != nil {
		return failedCall(b.metrics, b.pollInterval, fmt.Errorf("power on %s at site %s: %w", v.id, site, err))
	}

	logger.Info("powered on", zap.String("site", site), zap.String("mode", string(plan.Mode)), zap.String("how", how))
	note(b.journal, v.id, "power", "powered on into "+string(plan.Mode)+" mode"+how)

	return nil
}

// prepareBoot readies a machine's next boot into mode before it is powered on or cycled: a plan the edge
// serves (agent, install) is booted by a one-time network boot, or at a site without DHCP from the image of the
// plan its BMC mounts; the disk at such a site needs the image ejected (a firmware that prefers removable media
// would boot it again). It returns how the machine boots, for the timeline.
func (b *booter) prepareBoot(ctx context.Context, site, id string, bmc *specs.BMCConfigurationSpec, mode bootplans.Mode) (string, error) {
	image := b.policies.BootsFromImage(site)

	switch {
	case mode.PXE() && image:
		addr, err := b.power.BootFromImage(ctx, site, id, bmc)
		if err != nil {
			return "", fmt.Errorf("boot %s at site %s from virtual media: %w", id, site, err)
		}

		return " from virtual media (static address " + addr + ")", nil
	case mode.PXE():
		if err := b.power.SetPXEOnce(ctx, site, id, bmc); err != nil {
			return "", fmt.Errorf("set one-time pxe boot of %s at site %s: %w", id, site, err)
		}

		return " by network boot", nil
	case image:
		if err := b.power.EjectImage(ctx, site, id, bmc); err != nil {
			return "", fmt.Errorf("eject the virtual media of %s at site %s: %w", id, site, err)
		}
	}

	return "", nil
}
