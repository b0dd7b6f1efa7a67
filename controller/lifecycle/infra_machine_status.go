package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	omniresources "github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// mirroredLabels are copied from the InfraMachine to its InfraMachineStatus.
var mirroredLabels = []string{omnires.LabelCluster, omnires.LabelMachineSet, omnires.LabelControlPlaneRole, omnires.LabelWorkerRole}

// infraMachineStatus reports the lifecycle back to Omni in InfraMachineStatus: power state, ready to use,
// installed, last reboot, wiped node token and the power-off request being honoured; cluster labels mirrored;
// the site's, the operator's and the hardware inventory's labels published.
type infraMachineStatus struct {
	noTeardown

	providerID   string
	staticLabels map[string]string
	// journal is told each machine's summary (optional: nil).
	journal      Journal
	pollInterval time.Duration
}

func newInfraMachineStatusController(e *env, d Deps) *machineController {
	s := &infraMachineStatus{providerID: d.Types.ProviderID, staticLabels: e.cfg.StaticLabels, journal: d.Journal, pollInterval: e.cfg.PollInterval}

	return newMachineController(e, "lifecycle.InfraMachineStatusController", infra.InfraMachineStatusType,
		omniresources.InfraProviderNamespace, ownRecords|inventoryRecord, s)
}

func (s *infraMachineStatus) reconcile(ctx context.Context, _ *zap.Logger, r controller.QRuntime, v *view) error {
	if err := s.write(ctx, r, v); err != nil {
		return err
	}

	if s.journal != nil {
		s.journal.Summarize(v.id, v.summary())
	}

	// Driven by its inputs; looked at again after two poll intervals anyway, so a status written from a read
	// the cache had not caught up with yet never stays wrong.
	return controller.NewRequeueInterval(2 * s.pollInterval)
}

// write brings the machine's InfraMachineStatus to what v says. The status as the cache has it is compared
// first: a modify reads the resource from Omni before it writes, and a steady fleet must cost Omni nothing.
// (A cache behind this process's own last write only costs that read.)
func (s *infraMachineStatus) write(ctx context.Context, r controller.QRuntime, v *view) error {
	cur, ok, err := getSpec[*infra.MachineStatus](ctx, r, *infra.NewMachineStatus(v.id).Metadata())
	if err != nil {
		return err
	}

	if ok {
		want := cur.DeepCopy().(*infra.MachineStatus) //nolint:errcheck // a copy of its own type
		s.apply(v, want)

		if resource.Equal(cur, want) {
			return nil
		}
	}

	if err = safe.WriterModify(ctx, r, infra.NewMachineStatus(v.id), func(st *infra.MachineStatus) error {
		s.apply(v, st)

		return nil
	}); err != nil {
		return fmt.Errorf("write infra machine status: %w", err)
	}

	return nil
}

// apply sets st to what v says.
func (s *infraMachineStatus) apply(v *view, st *infra.MachineStatus) {
	{
		spec := st.TypedSpec().Value

		switch v.powerState() {
		case specs.MachineObservationSpec_POWER_STATE_ON:
			spec.PowerState = omnispecs.InfraMachineStatusSpec_POWER_STATE_ON
		case specs.MachineObservationSpec_POWER_STATE_OFF:
			spec.PowerState = omnispecs.InfraMachineStatusSpec_POWER_STATE_OFF
		default:
			spec.PowerState = omnispecs.InfraMachineStatusSpec_POWER_STATE_UNKNOWN
		}

		spec.ReadyToUse = v.readyToUse()
		spec.Installed = v.installed()

		if v.reboot != nil {
			spec.LastRebootId = v.reboot.GetLastRebootId()
			spec.LastRebootTimestamp = v.reboot.GetLastReboot()
		}

		if v.wipe != nil {
			spec.WipedNodeUniqueToken = v.wipe.GetWipedNodeUniqueToken()
		}

		spec.LastPowerOffId = ""
		if v.powerOffActive() {
			spec.LastPowerOffId = v.machine.GetPowerOffRequestId()
		}

		for _, key := range mirroredLabels {
			if value, ok := v.labels.Get(key); ok {
				st.Metadata().Labels().Set(key, value)
			} else {
				st.Metadata().Labels().Delete(key)
			}
		}

		st.Metadata().Labels().Set(omnires.LabelInfraProviderID, s.providerID)

		// the inventory, site and operator labels, which Omni shows as omni.sidero.dev/infra-provider/<id>/<key>
		// (the observation carries the site's labels, so a change of them reaches this controller)
		site, _ := v.site()

		labels.Apply(st.Metadata().Labels().Raw(),
			labels.Machine(inventoryLabels(v.inv), s.staticLabels, v.obs.GetSiteLabels(), site, v.obs.GetAlert()),
			st.Metadata().Labels().Set, st.Metadata().Labels().Delete)
	}
}
