package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/shared/metal"
)

// view is what the lifecycle knows about one machine, as far as a step reads it: Omni's wishes (InfraMachine,
// BMCConfig) and the controller's own records. Missing records, and those the step does not read, are nil.
type view struct {
	id      string
	machine *omnispecs.InfraMachineSpec
	labels  *resource.Labels
	omniBMC *omnispecs.InfraMachineBMCConfigSpec
	bmc     *specs.BMCConfigurationSpec
	wipe    *specs.WipeStatusSpec
	power   *specs.PowerOperationSpec
	reboot  *specs.RebootStatusSpec
	obs     *specs.MachineObservationSpec
	inv     *specs.MachineInventorySpec

	finalizers resource.Finalizers // set during teardown only

	// sealedBMC is a BMC configuration whose password could not be opened (secretsErr says why); clearBMC
	// marks one stored with its password in the clear (before sealing), to be sealed.
	sealedBMC  *specs.BMCConfigurationSpec
	secretsErr error
	clearBMC   bool
}

func getSpec[T resource.Resource](ctx context.Context, r controller.Reader, md resource.Metadata) (T, bool, error) {
	res, err := safe.ReaderGet[T](ctx, r, md)

	switch {
	case err == nil:
		return res, true, nil
	case state.IsNotFoundError(err):
		return res, false, nil
	default:
		return res, false, fmt.Errorf("read %s %s: %w", md.Type(), md.ID(), err)
	}
}

// loadView reads the records of m that reads names.
func loadView(ctx context.Context, r controller.Reader, t resources.Types, m *infra.Machine, reads records) (*view, error) {
	id := m.Metadata().ID()
	v := &view{id: id, machine: m.TypedSpec().Value, labels: m.Metadata().Labels()}

	if reads.has(omniBMCRecord) {
		if b, ok, err := getSpec[*infra.BMCConfig](ctx, r, *infra.NewBMCConfig(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.omniBMC = b.TypedSpec().Value.GetConfig()
		}
	}

	if reads.has(bmcRecord) {
		if b, ok, err := getSpec[*resources.BMCConfiguration](ctx, r, *t.NewBMCConfiguration(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.bmc = b.TypedSpec().Value
		}
	}

	if reads.has(wipeRecord) {
		if w, ok, err := getSpec[*resources.WipeStatus](ctx, r, *t.NewWipeStatus(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.wipe = w.TypedSpec().Value
		}
	}

	if reads.has(powerRecord) {
		if p, ok, err := getSpec[*resources.PowerOperation](ctx, r, *t.NewPowerOperation(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.power = p.TypedSpec().Value
		}
	}

	if reads.has(rebootRecord) {
		if rb, ok, err := getSpec[*resources.RebootStatus](ctx, r, *t.NewRebootStatus(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.reboot = rb.TypedSpec().Value
		}
	}

	if reads.has(observationRecord) {
		if o, ok, err := getSpec[*resources.MachineObservation](ctx, r, *t.NewMachineObservation(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.obs = o.TypedSpec().Value
		}
	}

	if reads.has(inventoryRecord) {
		if o, ok, err := getSpec[*resources.MachineInventory](ctx, r, *t.NewMachineInventory(id).Metadata()); err != nil {
			return nil, err
		} else if ok {
			v.inv = o.TypedSpec().Value
		}
	}

	return v, nil
}

func (v *view) accepted() bool {
	return v.machine.GetAcceptanceStatus() == omnispecs.InfraMachineConfigSpec_ACCEPTED
}

// managed reports whether the controller may act on the machine at all: accepted and not cordoned.
func (v *view) managed() bool { return v.accepted() && !v.machine.GetCordoned() }

func (v *view) allocated() bool { return v.machine.GetClusterTalosVersion() != "" }

func (v *view) bmcConfigured() bool { return v.bmc != nil }

// installed: an install was reported after the last wipe (a wipe forgets earlier installs).
func (v *view) installed() bool {
	var atWipe uint64
	if v.wipe != nil {
		atWipe = v.wipe.GetInstallEventIdAtWipe()
	}

	return v.machine.GetInstallEventId() > atWipe
}

// requiresWipe: never wiped (a record holding only an open intent is not a wipe), or Omni asked for a new
// wipe since.
func (v *view) requiresWipe() bool {
	return v.wipe.GetWipedAt() == nil || v.wipe.GetLastWipeId() != v.machine.GetWipeId()
}

func (v *view) requiresPowerOn() bool { return v.allocated() || v.installed() || v.requiresWipe() }

func (v *view) preferredOn() bool {
	return v.machine.GetPreferredPowerState() == omnispecs.InfraMachineSpec_POWER_STATE_ON
}

// powerOffActive: the user's power-off request was acknowledged under the current wipe ID.
func (v *view) powerOffActive() bool {
	req := v.machine.GetPowerOffRequestId()

	return req != "" && v.power != nil && v.power.GetPowerOffRequestId() == req && v.power.GetPowerOffWipeId() == v.machine.GetWipeId()
}

func (v *view) readyToUse() bool { return v.bmcConfigured() && !v.requiresWipe() }

func (v *view) site() (string, bool) {
	if v.obs == nil || v.obs.GetSiteId() == "" {
		return "", false
	}

	return v.obs.GetSiteId(), true
}

func (v *view) powerState() specs.MachineObservationSpec_PowerState {
	return v.obs.GetPowerState()
}

func (v *view) agentConnected() bool { return v.obs.GetAgentConnected() }

func (v *view) situation(deleting bool) bootplans.Situation {
	s := bootplans.Situation{
		Deleting:      deleting,
		Allocated:     v.allocated(),
		BMCConfigured: v.bmcConfigured(),
		RequiresWipe:  v.requiresWipe(),
		Installed:     v.installed(),
	}

	switch v.machine.GetAcceptanceStatus() {
	case omnispecs.InfraMachineConfigSpec_ACCEPTED:
		s.Acceptance = bootplans.Accepted
	case omnispecs.InfraMachineConfigSpec_REJECTED:
		s.Acceptance = bootplans.Rejected
	default:
		s.Acceptance = bootplans.Pending
	}

	return s
}

func (v *view) mode() bootplans.Mode { return bootplans.Decide(v.situation(false)) }

// planInput is the machine as its plan takes it. Its Omni resource ID is the ID its agent reported: taken in
// the lenient form (metal.NormalizeID) and checked by the edge that gets the plan.
func (v *view) planInput(deleting bool) bootplans.Machine {
	return bootplans.Machine{
		ID:              metal.ID(metal.NormalizeID(v.id)),
		Situation:       v.situation(deleting),
		TalosVersion:    v.machine.GetClusterTalosVersion(),
		Extensions:      v.machine.GetExtensions(),
		ExtraKernelArgs: v.machine.GetExtraKernelArgs(),
	}
}

// lastKick is the last time the controller powered the machine on, rebooted or wiped it (the cooldown's start).
func (v *view) lastKick() time.Time {
	var t time.Time

	if v.wipe != nil && v.wipe.GetWipedAt() != nil {
		t = v.wipe.GetWipedAt().AsTime()
	}

	if v.power != nil && v.power.GetLastPowerOn() != nil && v.power.GetLastPowerOn().AsTime().After(t) {
		t = v.power.GetLastPowerOn().AsTime()
	}

	if v.reboot != nil && v.reboot.GetLastReboot() != nil && v.reboot.GetLastReboot().AsTime().After(t) {
		t = v.reboot.GetLastReboot().AsTime()
	}

	return t
}

// cooldownLeft is how long the machine must still be left alone after the last power-on or reboot.
func cooldownLeft(v *view, cooldown time.Duration, now func() time.Time) time.Duration {
	last := v.lastKick()
	if last.IsZero() {
		return 0
	}

	return max(0, last.Add(cooldown).Sub(now()))
}

// agentGraceLeft is how much of the agent reconnect grace is left for a machine whose agent went lately and is
// to be in agent mode (0 for any other).
func agentGraceLeft(v *view, grace time.Duration, now func() time.Time) time.Duration {
	lost := v.obs.GetAgentLostAt()
	if v.mode() != bootplans.ModeAgent || v.agentConnected() || !lost.IsValid() {
		return 0
	}

	return max(0, lost.AsTime().Add(grace).Sub(now()))
}

// ours reports whether an InfraMachine belongs to this provider.
func (e *env) ours(m *infra.Machine) bool {
	id, _ := m.Metadata().Labels().Get(omnires.LabelInfraProviderID)

	return id == e.types.ProviderID
}

// waitFor is a requeue after poll for things outside the controller's hands (agent not connected, site
// offline).
func waitFor(logger *zap.Logger, reason string, poll time.Duration) error {
	logger.Debug("waiting", zap.String("reason", reason))

	return controller.NewRequeueInterval(poll)
}

// failedCall is a requeue for an edge call that failed (counted in m, retried after poll): logged, retried with backoff, never acted on elsewhere.
func failedCall(m *Metrics, poll time.Duration, err error) error {
	m.edgeFailure(err)

	// A BMC's permanent refusal (wrong credentials, a command it does not support: the edge says
	// FailedPrecondition) is not retried at the poll interval: that locks BMC accounts and floods logs. It
	// waits ten intervals, for an operator to fix it.
	if status.Code(err) == codes.FailedPrecondition {
		return controller.NewRequeueError(fmt.Errorf("permanent, retried slowly: %w", err), 10*poll)
	}

	return controller.NewRequeueError(err, poll)
}
