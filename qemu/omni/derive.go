package omni

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// deriver plays Omni v1.9.3's InfraMachine and BMCConfig controllers: every InfraMachine follows from the
// machine's Link, the user's InfraMachineConfig, the allocation (ClusterMachine, Cluster, MachineExtensions)
// and whether Omni has collected the machine's information.
type deriver struct {
	st     state.State
	logger *zap.Logger
}

func newDeriver(st state.State, logger *zap.Logger) *deriver {
	return &deriver{st: st, logger: logger}
}

// inputs are the kinds whose changes re-derive the InfraMachines.
var deriverInputs = []resource.Kind{
	siderolink.NewLink("", nil).Metadata(),
	omnires.NewMachineSetNode("", omnires.NewMachineSet("")).Metadata(),
	omnires.NewInfraMachineConfig("").Metadata(),
	omnires.NewClusterMachine("").Metadata(),
	omnires.NewCluster("").Metadata(),
	omnires.NewMachineExtensions("").Metadata(),
	omnires.NewMachineStatus("").Metadata(),
	omnires.NewInfraMachineBMCConfig("").Metadata(),
	siderolink.NewNodeUniqueToken("").Metadata(),
	infra.NewMachine("").Metadata(),
	infra.NewMachineStatus("").Metadata(),
}

// Run derives every InfraMachine, then again those whose inputs change (all of them when a Cluster does), until
// ctx ends. A watch that breaks (a burst of changes overran it) is set up again, followed by a full pass: nothing
// is missed.
func (d *deriver) Run(ctx context.Context) error {
	for {
		if err := d.watchAndDerive(ctx); err != nil {
			d.logger.Warn("infra machine watch broke, watching again", zap.Error(err))
		}

		if ctx.Err() != nil {
			return nil
		}
	}
}

func (d *deriver) watchAndDerive(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	events := make(chan state.Event, 1024)

	for _, kind := range deriverInputs {
		if err := d.st.WatchKind(ctx, kind, events); err != nil {
			return fmt.Errorf("watch %s: %w", kind.Type(), err)
		}
	}

	// The first pass covers every machine; after it, only the machines the events name (every input but the
	// Cluster is keyed by the machine's ID), so that a fleet's steady trickle of writes does not re-derive
	// every machine each time.
	full, allocate := true, true
	dirty := map[string]bool{}

	for {
		if full || allocate {
			if err := d.allocations(ctx); err != nil && ctx.Err() == nil {
				d.logger.Warn("derive cluster machines", zap.Error(err))
			}
		}

		var err error

		if full {
			err = d.reconcile(ctx)
		} else {
			err = d.reconcileIDs(ctx, dirty)
		}

		full, allocate, dirty = false, false, map[string]bool{}

		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down
			}

			d.logger.Warn("derive infra machines", zap.Error(err))

			full = true // what failed is derived again with everything else on the next event
		}

		var ev state.Event

		select {
		case <-ctx.Done():
			return nil
		case ev = <-events:
		}

		// drain what else arrived: one pass covers them all
		for drained := false; !drained; {
			if ev.Type == state.Errored {
				return ev.Error
			}

			markDirty(ev, &full, &allocate, dirty)

			select {
			case ev = <-events:
			default:
				drained = true
			}
		}
	}
}

// markDirty notes what an event asks to derive again: the machine it names, allocations for a MachineSetNode or
// ClusterMachine, every machine for a Cluster (its Talos version is every member's) or an event without a
// resource.
func markDirty(ev state.Event, full, allocate *bool, dirty map[string]bool) {
	if ev.Resource == nil {
		*full = true

		return
	}

	md := ev.Resource.Metadata()

	switch md.Type() {
	case omnires.ClusterType:
		*full = true
	case omnires.MachineSetNodeType, omnires.ClusterMachineType:
		*allocate = true
		dirty[md.ID()] = true
	default:
		dirty[md.ID()] = true
	}
}

// reconcileIDs derives the InfraMachines of the given machines: from their Link when it is there, removed when it
// is not.
func (d *deriver) reconcileIDs(ctx context.Context, ids map[string]bool) error {
	for id := range ids {
		link, ok, err := getOptional[*siderolink.Link](ctx, d.st, siderolink.NewLink(id, nil).Metadata())
		if err != nil {
			return err
		}

		if ok && link.Metadata().Phase() == resource.PhaseRunning {
			if providerID, has := link.Metadata().Labels().Get(omnires.LabelInfraProviderID); has {
				if err = d.machine(ctx, link, providerID); err != nil {
					return err
				}

				if err = d.bmcConfig(ctx, id); err != nil {
					return err
				}

				if err = d.providerLabels(ctx, id, providerID); err != nil {
					return err
				}

				continue
			}
		}

		m, exists, err := getOptional[*infra.Machine](ctx, d.st, infra.NewMachine(id).Metadata())
		if err != nil {
			return err
		}

		if exists {
			if err = d.remove(ctx, m); err != nil {
				return err
			}
		}
	}

	return nil
}

// allocations plays Omni's cluster machine controller: every MachineSetNode (what `omnictl cluster template
// sync` writes for each machine of a machine set) gets a ClusterMachine with the cluster, machine-set and role
// labels; a ClusterMachine whose node is gone is torn down (Omni resets the machine) and destroyed.
func (d *deriver) allocations(ctx context.Context) error {
	nodes, err := safe.StateListAll[*omnires.MachineSetNode](ctx, d.st)
	if err != nil {
		return fmt.Errorf("list machine set nodes: %w", err)
	}

	want := map[string]bool{}

	for node := range nodes.All() {
		id := node.Metadata().ID()
		want[id] = node.Metadata().Phase() == resource.PhaseRunning

		if !want[id] {
			continue
		}

		setID, _ := node.Metadata().Labels().Get(omnires.LabelMachineSet)
		cluster, _ := node.Metadata().Labels().Get(omnires.LabelCluster)

		set, ok, err := getOptional[*omnires.MachineSet](ctx, d.st, omnires.NewMachineSet(setID).Metadata())
		if err != nil || !ok {
			return err
		}

		if err = safe.StateModify(ctx, d.st, omnires.NewClusterMachine(id), func(cm *omnires.ClusterMachine) error {
			labels := cm.Metadata().Labels()
			labels.Set(omnires.LabelCluster, cluster)
			labels.Set(omnires.LabelMachineSet, setID)

			for _, role := range []string{omnires.LabelControlPlaneRole, omnires.LabelWorkerRole} {
				if _, ok := set.Metadata().Labels().Get(role); ok {
					labels.Set(role, "")
				} else {
					labels.Delete(role)
				}
			}

			return nil
		}); err != nil {
			return fmt.Errorf("cluster machine %s: %w", id, err)
		}
	}

	machines, err := safe.StateListAll[*omnires.ClusterMachine](ctx, d.st)
	if err != nil {
		return fmt.Errorf("list cluster machines: %w", err)
	}

	for cm := range machines.All() {
		if want[cm.Metadata().ID()] {
			continue
		}

		// Omni resets the machine, then lets the ClusterMachine go; the InfraMachine derivation sees it
		// deallocating in between.
		if err = d.st.TeardownAndDestroy(ctx, cm.Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("release cluster machine %s: %w", cm.Metadata().ID(), err)
		}
	}

	return nil
}

func (d *deriver) reconcile(ctx context.Context) error {
	links, err := safe.StateListAll[*siderolink.Link](ctx, d.st)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}

	seen := map[string]bool{}

	for link := range links.All() {
		providerID, ok := link.Metadata().Labels().Get(omnires.LabelInfraProviderID)
		if !ok || link.Metadata().Phase() != resource.PhaseRunning {
			continue
		}

		seen[link.Metadata().ID()] = true

		if err = d.machine(ctx, link, providerID); err != nil {
			return err
		}

		if err = d.bmcConfig(ctx, link.Metadata().ID()); err != nil {
			return err
		}

		if err = d.providerLabels(ctx, link.Metadata().ID(), providerID); err != nil {
			return err
		}
	}

	machines, err := safe.StateListAll[*infra.Machine](ctx, d.st)
	if err != nil {
		return fmt.Errorf("list infra machines: %w", err)
	}

	for m := range machines.All() {
		if seen[m.Metadata().ID()] {
			continue
		}

		if err = d.remove(ctx, m); err != nil {
			return err
		}
	}

	return nil
}

// remove tears an InfraMachine down and destroys it once the provider released its finalizers.
func (d *deriver) remove(ctx context.Context, m *infra.Machine) error {
	if m.Metadata().Phase() == resource.PhaseRunning {
		if _, err := d.st.Teardown(ctx, m.Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("tear down infra machine %s: %w", m.Metadata().ID(), err)
		}

		return nil // the teardown is an update: the watch brings us back
	}

	if m.Metadata().Finalizers().Empty() {
		if err := d.st.Destroy(ctx, m.Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("destroy infra machine %s: %w", m.Metadata().ID(), err)
		}

		for _, md := range []*resource.Metadata{infra.NewMachineStatus(m.Metadata().ID()).Metadata(), infra.NewBMCConfig(m.Metadata().ID()).Metadata()} {
			if err := d.st.Destroy(ctx, md); err != nil && !state.IsNotFoundError(err) {
				return fmt.Errorf("destroy %s %s: %w", md.Type(), md.ID(), err)
			}
		}

		d.logger.Info("infra machine removed", zap.String("machine", m.Metadata().ID()))
	}

	return nil
}

func getOptional[T resource.Resource](ctx context.Context, st state.State, md *resource.Metadata) (T, bool, error) {
	r, err := safe.StateGet[T](ctx, st, md)

	switch {
	case err == nil:
		return r, true, nil
	case state.IsNotFoundError(err):
		return r, false, nil
	default:
		return r, false, fmt.Errorf("get %s %s: %w", md.Type(), md.ID(), err)
	}
}

func (d *deriver) machine(ctx context.Context, link *siderolink.Link, providerID string) error {
	id := link.Metadata().ID()

	cfg, _, err := getOptional[*omnires.InfraMachineConfig](ctx, d.st, omnires.NewInfraMachineConfig(id).Metadata())
	if err != nil {
		return err
	}

	ms, collected, err := getOptional[*omnires.MachineStatus](ctx, d.st, omnires.NewMachineStatus(id).Metadata())
	if err != nil {
		return err
	}

	collected = collected && ms.TypedSpec().Value.SecurityState != nil // what Omni waits for

	cm, allocated, err := getOptional[*omnires.ClusterMachine](ctx, d.st, omnires.NewClusterMachine(id).Metadata())
	if err != nil {
		return err
	}

	deallocating := allocated && cm.Metadata().Phase() == resource.PhaseTearingDown

	var (
		talosVersion string
		extensions   []string
	)

	if allocated && !deallocating {
		clusterName, _ := cm.Metadata().Labels().Get(omnires.LabelCluster)

		cluster, ok, err := getOptional[*omnires.Cluster](ctx, d.st, omnires.NewCluster(clusterName).Metadata())
		if err != nil {
			return err
		}

		if ok {
			talosVersion = cluster.TypedSpec().Value.TalosVersion
		}

		ext, ok, err := getOptional[*omnires.MachineExtensions](ctx, d.st, omnires.NewMachineExtensions(id).Metadata())
		if err != nil {
			return err
		}

		if ok {
			extensions = slices.Clone(ext.TypedSpec().Value.Extensions)
		}
	}

	prev, exists, err := getOptional[*infra.Machine](ctx, d.st, infra.NewMachine(id).Metadata())
	if err != nil {
		return err
	}

	if exists && prev.Metadata().Phase() != resource.PhaseRunning {
		return nil
	}

	want := &specs.InfraMachineSpec{
		ClusterTalosVersion: talosVersion,
		Extensions:          extensions,
	}

	if tok, ok, err := getOptional[*siderolink.NodeUniqueToken](ctx, d.st, siderolink.NewNodeUniqueToken(id).Metadata()); err != nil {
		return err
	} else if ok {
		want.NodeUniqueToken = tok.TypedSpec().Value.Token
	}

	want.InstallEventId, _ = strconv.ParseUint(link.Metadata().Annotations().Raw()[installEventsAnnotation], 10, 64)

	if cfg != nil {
		c := cfg.TypedSpec().Value
		want.AcceptanceStatus = c.AcceptanceStatus
		want.Cordoned = c.Cordoned
		want.ExtraKernelArgs = c.ExtraKernelArgs
		want.RequestedRebootId = c.RequestedRebootId

		if c.PowerState == specs.InfraMachineConfigSpec_POWER_STATE_ON {
			want.PreferredPowerState = specs.InfraMachineSpec_POWER_STATE_ON
		}

		// the power-off request is cleared while the machine is not allocated or being deallocated, so it never
		// keeps the provider from powering the machine on to wipe it
		if talosVersion != "" {
			want.PowerOffRequestId = c.PowerOffRequestId
		}
	}

	// until Omni has collected the machine's information, it keeps the machine powered on
	if !collected {
		want.PreferredPowerState = specs.InfraMachineSpec_POWER_STATE_ON
	}

	if exists {
		want.WipeId = prev.TypedSpec().Value.WipeId

		// released: once the machine is reset, a new wipe ID asks the provider to wipe it
		if prev.TypedSpec().Value.ClusterTalosVersion != "" && talosVersion == "" {
			want.WipeId = newID()
		}
	}

	return safe.StateModify(ctx, d.st, infra.NewMachine(id), func(m *infra.Machine) error {
		labels := m.Metadata().Labels()
		labels.Set(omnires.LabelInfraProviderID, providerID)

		if want.AcceptanceStatus == specs.InfraMachineConfigSpec_PENDING {
			labels.Set(omnires.LabelMachinePendingAccept, "")
		} else {
			labels.Delete(omnires.LabelMachinePendingAccept)
		}

		for _, key := range []string{omnires.LabelCluster, omnires.LabelMachineSet, omnires.LabelControlPlaneRole, omnires.LabelWorkerRole} {
			value, ok := "", false
			if talosVersion != "" {
				value, ok = cm.Metadata().Labels().Get(key)
			}

			if ok {
				labels.Set(key, value)
			} else {
				labels.Delete(key)
			}
		}

		if !proto.Equal(m.TypedSpec().Value, want) {
			m.TypedSpec().Value = want
		}

		return nil
	})
}

// providerLabels plays Omni's MachineStatus controller for what a provider publishes: the InfraMachineStatus
// labels outside Omni's own prefix become MachineStatus labels omni.sidero.dev/infra-provider/<id>/<key>, which
// MachineClass selectors match.
func (d *deriver) providerLabels(ctx context.Context, id, providerID string) error {
	ims, ok, err := getOptional[*infra.MachineStatus](ctx, d.st, infra.NewMachineStatus(id).Metadata())
	if err != nil || !ok {
		return err
	}

	prefix := fmt.Sprintf(omnires.InfraProviderLabelPrefixFormat, providerID)

	want := map[string]string{}

	for k, v := range ims.Metadata().Labels().Raw() {
		if !strings.HasPrefix(k, omnires.SystemLabelPrefix) {
			want[prefix+k] = v
		}
	}

	return safe.StateModify(ctx, d.st, omnires.NewMachineStatus(id), func(ms *omnires.MachineStatus) error {
		for k := range ms.Metadata().Labels().Raw() {
			if _, keep := want[k]; strings.HasPrefix(k, prefix) && !keep {
				ms.Metadata().Labels().Delete(k)
			}
		}

		for k, v := range want {
			ms.Metadata().Labels().Set(k, v)
		}

		return nil
	})
}

// bmcConfig copies the user's InfraMachineBMCConfig to the provider-readable BMCConfig.
func (d *deriver) bmcConfig(ctx context.Context, id string) error {
	src, ok, err := getOptional[*omnires.InfraMachineBMCConfig](ctx, d.st, omnires.NewInfraMachineBMCConfig(id).Metadata())
	if err != nil || !ok {
		return err
	}

	return safe.StateModify(ctx, d.st, infra.NewBMCConfig(id), func(c *infra.BMCConfig) error {
		if !proto.Equal(c.TypedSpec().Value.GetConfig(), src.TypedSpec().Value) {
			c.TypedSpec().Value.Config = proto.Clone(src.TypedSpec().Value).(*specs.InfraMachineBMCConfigSpec)
		}

		return nil
	})
}
