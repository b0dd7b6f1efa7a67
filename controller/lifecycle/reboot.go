package lifecycle

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/safe"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// reboot reboots a running machine when the user asked (a new requested reboot ID) or when it must work and
// runs the wrong thing: it should be in agent mode but its agent is not connected, or it should install but its
// agent is connected. Idle machines that need no power are never rebooted. Controller-decided reboots respect
// the cooldown; a network-booting reboot waits for the edge's acknowledgement of the plan and sets one-time PXE.
type reboot struct {
	noTeardown

	env *env
}

func newRebootController(e *env) *machineController {
	return newMachineController(e, "lifecycle.RebootController", e.Types.RebootStatus, e.Types.Namespace, &reboot{env: e})
}

func (s *reboot) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	if !v.managed() || !v.bmcConfigured() || v.powerOffActive() || v.powerState() != specs.MachineObservationSpec_POWER_STATE_ON {
		return nil
	}

	site, ok := v.site()
	if !ok {
		return nil
	}

	rs := &specs.RebootStatusSpec{}
	if v.reboot != nil {
		rs = proto.Clone(v.reboot).(*specs.RebootStatusSpec) //nolint:forcetypeassert
	}

	req := v.machine.GetRequestedRebootId()

	switch {
	case req != "" && req != rs.GetLastRebootId():
		rs.LastRebootId = req
		rs.Reason = "requested"
	case v.requiresPowerOn() && wrongMode(v):
		if left := s.env.cooldownLeft(v); left > 0 {
			return controller.NewRequeueInterval(min(left, s.env.cfg.PollInterval))
		}

		rs.Reason = "wrong-mode"
	default:
		return nil
	}

	plan, err := s.env.plan(ctx, site, v, false)
	if err != nil {
		return s.env.failed(fmt.Errorf("plan of %s: %w", v.id, err))
	}

	if err = s.env.gate.ensure(ctx, site, plan); err != nil {
		return s.env.failed(err)
	}

	callCtx, cancel := context.WithTimeout(ctx, s.env.cfg.CallTimeout)
	defer cancel()

	if plan.Mode.PXE() {
		if err = s.env.Power.SetPXEOnce(callCtx, site, v.id, v.bmc); err != nil {
			return s.env.failed(fmt.Errorf("set one-time pxe boot of %s at site %s: %w", v.id, site, err))
		}
	}

	if err = s.env.Power.PowerCycle(callCtx, site, v.id, v.bmc); err != nil {
		return s.env.failed(fmt.Errorf("reboot %s at site %s: %w", v.id, site, err))
	}

	rs.LastReboot = timestamppb.New(s.env.Now())

	logger.Info("rebooted", zap.String("site", site), zap.String("reason", rs.Reason), zap.String("mode", string(plan.Mode)))

	if err = safe.WriterModify(ctx, r, s.env.Types.NewRebootStatus(v.id), func(res *resources.RebootStatus) error {
		res.TypedSpec().Value = rs

		return nil
	}); err != nil {
		return fmt.Errorf("record reboot: %w", err)
	}

	return nil
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
