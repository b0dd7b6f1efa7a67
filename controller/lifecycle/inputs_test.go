package lifecycle_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/resources"
)

// Each lifecycle controller is woken by the records its decisions read, and by no others: the observation
// does not look at wipes, power operations or reboots, the teardown looks at nothing until the machine is
// deleted. Before, every controller had every record as an input, so each write woke all eight.
func TestControllersAreWokenByWhatTheyRead(t *testing.T) {
	t.Parallel()

	types := resources.NewTypes(providerID)
	inputs := map[string][]resource.Type{}

	for _, c := range newControllers(t, lifecycle.Default(), types) {
		var mapped []resource.Type

		for _, in := range c.Settings().Inputs {
			switch {
			case in.Kind == controller.InputQPrimary:
				require.Equal(t, infra.InfraMachineType, in.Type, c.Name())
			case strings.HasSuffix(in.Type, "Dues.outpost.local"): // its own schedule
			default:
				mapped = append(mapped, in.Type)
			}
		}

		slices.Sort(mapped)
		inputs[strings.TrimPrefix(c.Name(), "lifecycle.")] = mapped
	}

	sorted := func(typ ...resource.Type) []resource.Type {
		slices.Sort(typ)

		return typ
	}

	bmc, wipe, power, reboot, obs := types.BMCConfiguration, types.WipeStatus, types.PowerOperation, types.RebootStatus, types.MachineObservation

	require.Equal(t, sorted(bmc), inputs["MachineObservationController"])
	require.Equal(t, sorted(infra.BMCConfigType, obs), inputs["BMCConfigurationController"], "Omni's BMC config is read here only")
	require.Equal(t, sorted(bmc, obs), inputs["WipeController"])
	require.Equal(t, sorted(bmc, wipe, obs), inputs["BootPlanController"])
	require.Equal(t, sorted(bmc, wipe, reboot, obs), inputs["PowerController"], "the cooldown reads the last reboot")
	require.Equal(t, sorted(bmc, wipe, power, obs), inputs["RebootController"])
	require.Equal(t, sorted(bmc, wipe, power, reboot, obs, types.MachineInventory), inputs["InfraMachineStatusController"],
		"the inventory's labels are published there")
	require.Empty(t, inputs["TeardownController"])
	require.Empty(t, inputs["ScheduleController"])
}

// The lifecycle's finalizers go on a machine in one write: each write of the InfraMachine wakes every lifecycle
// controller, and eight writes (one per controller) made 64 wake-ups per machine accepted.
func TestFinalizersAddedInOneWrite(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	h.ready("m1", "site-a")

	m, err := safe.StateGetByID[*infra.Machine](t.Context(), h.st, "m1")
	require.NoError(t, err)

	var ours []string

	for _, f := range *m.Metadata().Finalizers() {
		if strings.HasPrefix(f, "lifecycle.") {
			ours = append(ours, f)
		}
	}

	require.Len(t, ours, 8, "every machine controller's finalizer: %v", ours)
	require.Equal(t, int64(1), h.omniReads.machineWrites.Load(), "added in one write")
}
