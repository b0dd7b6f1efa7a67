package omni

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/siderolabs/omni/client/pkg/omni/resources/siderolink"
)

// installEventsAnnotation is where the stand-in counts the install events a machine reported (Omni keeps the
// count internally and exposes it as InfraMachine.install_event_id).
const installEventsAnnotation = "omni-stand-in/install-events"

// Admin performs user actions the way Omni's UI and omnictl do: by writing Omni's own resources
// (InfraMachineConfig, Cluster, ClusterMachine, MachineExtensions) with an admin identity.
// It works on the stand-in's local state or on a remote one reached with the admin service-account key.
type Admin struct {
	st state.State
}

// NewAdmin returns an Admin acting on st.
func NewAdmin(st state.State) *Admin { return &Admin{st: st} }

func (a *Admin) config(ctx context.Context, id string, fn func(*specs.InfraMachineConfigSpec)) error {
	if err := safe.StateModify(ctx, a.st, omnires.NewInfraMachineConfig(id), func(c *omnires.InfraMachineConfig) error {
		fn(c.TypedSpec().Value)

		return nil
	}); err != nil {
		return fmt.Errorf("update infra machine config %s: %w", id, err)
	}

	return nil
}

// Accept accepts a pending machine.
func (a *Admin) Accept(ctx context.Context, id string) error {
	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.AcceptanceStatus = specs.InfraMachineConfigSpec_ACCEPTED })
}

// Reject rejects a machine.
func (a *Admin) Reject(ctx context.Context, id string) error {
	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.AcceptanceStatus = specs.InfraMachineConfigSpec_REJECTED })
}

// Cordon sets or clears the cordon of a machine.
func (a *Admin) Cordon(ctx context.Context, id string, cordoned bool) error {
	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.Cordoned = cordoned })
}

// SetPowerState sets the preferred power state ("default", "on" or "off").
func (a *Admin) SetPowerState(ctx context.Context, id, value string) error {
	v, ok := map[string]specs.InfraMachineConfigSpec_MachinePowerState{
		"default": specs.InfraMachineConfigSpec_POWER_STATE_DEFAULT,
		"on":      specs.InfraMachineConfigSpec_POWER_STATE_ON,
		"off":     specs.InfraMachineConfigSpec_POWER_STATE_OFF,
	}[value]
	if !ok {
		return fmt.Errorf("power state %q: want default, on or off", value)
	}

	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.PowerState = v })
}

// SetExtraKernelArgs sets the machine's extra kernel arguments.
func (a *Admin) SetExtraKernelArgs(ctx context.Context, id, args string) error {
	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.ExtraKernelArgs = args })
}

// Reboot requests a reboot and returns the request ID.
func (a *Admin) Reboot(ctx context.Context, id string) (string, error) {
	req := newID()

	return req, a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.RequestedRebootId = req })
}

// PowerOff requests a shutdown and returns the request ID.
func (a *Admin) PowerOff(ctx context.Context, id string) (string, error) {
	req := newID()

	return req, a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.PowerOffRequestId = req })
}

// ClearPowerOff withdraws the machine's power-off request. Omni copies the request onto the InfraMachine only
// while the machine is allocated, so a request left over from before an allocation would power it off then.
func (a *Admin) ClearPowerOff(ctx context.Context, id string) error {
	return a.config(ctx, id, func(s *specs.InfraMachineConfigSpec) { s.PowerOffRequestId = "" })
}

// Allocate adds the machine to cluster (created with talosVersion when missing) with the given extensions,
// as a control plane or worker node, the way `omnictl cluster template sync` does: it writes the Cluster, the
// machine set and a MachineSetNode for the machine; Omni makes the ClusterMachine from them.
func (a *Admin) Allocate(ctx context.Context, id, cluster, talosVersion string, extensions []string, controlPlane bool) error {
	if err := safe.StateModify(ctx, a.st, omnires.NewCluster(cluster), func(c *omnires.Cluster) error {
		c.TypedSpec().Value.TalosVersion = talosVersion

		return nil
	}); err != nil {
		return fmt.Errorf("create cluster %s: %w", cluster, err)
	}

	setID, role := omnires.WorkersResourceID(cluster), omnires.LabelWorkerRole
	if controlPlane {
		setID, role = omnires.ControlPlanesResourceID(cluster), omnires.LabelControlPlaneRole
	}

	set := omnires.NewMachineSet(setID)

	if err := safe.StateModify(ctx, a.st, set, func(ms *omnires.MachineSet) error {
		ms.Metadata().Labels().Set(omnires.LabelCluster, cluster)
		ms.Metadata().Labels().Set(role, "")

		return nil
	}); err != nil {
		return fmt.Errorf("create machine set %s: %w", setID, err)
	}

	if err := safe.StateModify(ctx, a.st, omnires.NewMachineExtensions(id), func(e *omnires.MachineExtensions) error {
		e.Metadata().Labels().Set(omnires.LabelCluster, cluster)
		e.TypedSpec().Value.Extensions = extensions

		return nil
	}); err != nil {
		return fmt.Errorf("set extensions of %s: %w", id, err)
	}

	if err := safe.StateModify(ctx, a.st, omnires.NewMachineSetNode(id, set), func(n *omnires.MachineSetNode) error {
		n.Metadata().Labels().Set(omnires.LabelCluster, cluster)
		n.Metadata().Labels().Set(omnires.LabelMachineSet, setID)

		return nil
	}); err != nil {
		return fmt.Errorf("allocate %s: %w", id, err)
	}

	return nil
}

// Release removes the machine from its cluster (its MachineSetNode); Omni then resets it and sets a new wipe ID.
func (a *Admin) Release(ctx context.Context, id string) error {
	set := omnires.NewMachineSet("")

	for _, md := range []*resource.Metadata{omnires.NewMachineSetNode(id, set).Metadata(), omnires.NewMachineExtensions(id).Metadata()} {
		if err := a.st.TeardownAndDestroy(ctx, md); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("release %s: %w", id, err)
		}
	}

	return nil
}

// ReportInstalled counts an install event, as when the machine reports Talos installed on its disk.
func (a *Admin) ReportInstalled(ctx context.Context, id string) error {
	_, err := safe.StateUpdateWithConflicts(ctx, a.st, siderolink.NewLink(id, nil).Metadata(), func(l *siderolink.Link) error {
		n, _ := strconv.ParseUint(l.Metadata().Annotations().Raw()[installEventsAnnotation], 10, 64)
		l.Metadata().Annotations().Set(installEventsAnnotation, strconv.FormatUint(n+1, 10))

		return nil
	})
	if err != nil {
		return fmt.Errorf("count install event of %s: %w", id, err)
	}

	return nil
}

// CollectInfo records that Omni collected the machine's information, as when its Talos reports in over the
// Talos API through SideroLink: Omni counts it collected once MachineStatus.security_state is set.
func (a *Admin) CollectInfo(ctx context.Context, id, talosVersion string) error {
	if talosVersion == "" {
		talosVersion = "unknown"
	}

	if err := safe.StateModify(ctx, a.st, omnires.NewMachineStatus(id), func(ms *omnires.MachineStatus) error {
		ms.TypedSpec().Value.TalosVersion = talosVersion
		ms.TypedSpec().Value.Connected = true
		ms.TypedSpec().Value.SecurityState = &specs.SecurityState{}

		return nil
	}); err != nil {
		return fmt.Errorf("collect info of %s: %w", id, err)
	}

	return nil
}

// SetBMCConfig stores operator-supplied IPMI credentials for the machine.
func (a *Admin) SetBMCConfig(ctx context.Context, id string, ipmi *specs.InfraMachineBMCConfigSpec_IPMI) error {
	if err := safe.StateModify(ctx, a.st, omnires.NewInfraMachineBMCConfig(id), func(c *omnires.InfraMachineBMCConfig) error {
		c.TypedSpec().Value.Ipmi = ipmi

		return nil
	}); err != nil {
		return fmt.Errorf("set bmc config of %s: %w", id, err)
	}

	return nil
}

// Delete removes the machine from Omni: its link and settings go, and the InfraMachine is torn down.
func (a *Admin) Delete(ctx context.Context, id string) error {
	for _, md := range []*resource.Metadata{
		siderolink.NewLink(id, nil).Metadata(),
		omnires.NewInfraMachineConfig(id).Metadata(),
		omnires.NewMachineStatus(id).Metadata(),
		omnires.NewInfraMachineBMCConfig(id).Metadata(),
		siderolink.NewNodeUniqueToken(id).Metadata(),
	} {
		if err := a.st.TeardownAndDestroy(ctx, md); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}

	return nil
}

// Machine is one row of List.
type Machine struct {
	ID     string
	Spec   *specs.InfraMachineSpec
	Labels map[string]string
	Status *specs.InfraMachineStatusSpec // nil until the provider reports
}

// List returns the InfraMachines with their provider-reported status.
func (a *Admin) List(ctx context.Context) ([]Machine, error) {
	ms, err := safe.StateListAll[*infra.Machine](ctx, a.st)
	if err != nil {
		return nil, fmt.Errorf("list infra machines: %w", err)
	}

	out := make([]Machine, 0, ms.Len())

	for m := range ms.All() {
		row := Machine{ID: m.Metadata().ID(), Spec: m.TypedSpec().Value, Labels: m.Metadata().Labels().Raw()}

		st, err := safe.StateGetByID[*infra.MachineStatus](ctx, a.st, m.Metadata().ID())

		switch {
		case err == nil:
			row.Status = st.TypedSpec().Value
		case !state.IsNotFoundError(err):
			return nil, fmt.Errorf("get infra machine status %s: %w", row.ID, err)
		}

		out = append(out, row)
	}

	return out, nil
}

// JoinToken returns the join token of provider providerID's ProviderJoinConfig.
func (a *Admin) JoinToken(ctx context.Context, providerID string) (string, error) {
	jc, err := safe.StateGetByID[*siderolink.ProviderJoinConfig](ctx, a.st, providerID)
	if err != nil {
		return "", fmt.Errorf("get join config of %s: %w", providerID, err)
	}

	return MachineJoinToken(jc)
}

// MachineJoinToken returns the join token a machine presents to Provision: the one in the siderolink.api
// kernel argument of the provider's join config (the spec's join_token is the provider's raw secret).
func MachineJoinToken(jc *siderolink.ProviderJoinConfig) (string, error) {
	for _, arg := range jc.TypedSpec().Value.GetConfig().GetKernelArgs() {
		v, ok := strings.CutPrefix(arg, "siderolink.api=")
		if !ok {
			continue
		}

		u, err := url.Parse(v)
		if err != nil {
			return "", fmt.Errorf("siderolink.api of %s: %w", jc.Metadata().ID(), err)
		}

		if tok := u.Query().Get("jointoken"); tok != "" {
			return tok, nil
		}
	}

	return "", fmt.Errorf("join config of %s has no siderolink.api with a join token", jc.Metadata().ID())
}
