package lifecycle

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// Secrets seals what the lifecycle writes to Omni that must not be read there (BMC passwords: any Omni
// account with the Reader role can read the provider's namespace) and opens it again (seal.Box).
type Secrets interface {
	Seal(v string) (string, error)
	Open(v string) (string, error)
}

// loadView reads the records of m that reads names, with secrets opened for use in memory only. A BMC
// password that cannot be opened (sealed with another provider key) leaves the machine without a usable BMC
// configuration, which the BMC configuration step then provisions again.
func (e *env) loadView(ctx context.Context, r controller.Reader, m *infra.Machine, reads records) (*view, error) {
	v, err := loadView(ctx, r, e.types, m, reads)
	if err != nil {
		return nil, err
	}

	e.overlayOwnWrites(v, reads)

	if e.secrets == nil || v.bmc.GetIpmi().GetPassword() == "" {
		return v, nil
	}

	bmc := proto.Clone(v.bmc).(*specs.BMCConfigurationSpec)

	password, err := e.secrets.Open(bmc.GetIpmi().GetPassword())
	if err != nil {
		v.sealedBMC, v.bmc = v.bmc, nil
		v.secretsErr = fmt.Errorf("bmc password of %s: %w", v.id, err)

		return v, nil
	}

	v.clearBMC = password == bmc.GetIpmi().GetPassword() // stored before sealing existed
	bmc.Ipmi.Password = password
	v.bmc = bmc

	return v, nil
}

// sealBMC returns cfg as it is stored: its password sealed by secrets (nil: stored in the clear).
func sealBMC(secrets Secrets, cfg *specs.BMCConfigurationSpec) (*specs.BMCConfigurationSpec, error) {
	if secrets == nil || cfg.GetIpmi().GetPassword() == "" {
		return cfg, nil
	}

	out := proto.Clone(cfg).(*specs.BMCConfigurationSpec)

	sealed, err := secrets.Seal(out.GetIpmi().GetPassword())
	if err != nil {
		return nil, fmt.Errorf("seal bmc password: %w", err)
	}

	out.Ipmi.Password = sealed

	return out, nil
}

// overlayOwnWrites replaces what was read from the cache with what this process wrote last.
func (e *env) overlayOwnWrites(v *view, reads records) {
	if rec, ok := e.written.get(e.types.BMCConfiguration, v.id); ok && reads.has(bmcRecord) {
		v.bmc = rec.(*specs.BMCConfigurationSpec)
	}

	if rec, ok := e.written.get(e.types.WipeStatus, v.id); ok && reads.has(wipeRecord) {
		v.wipe = rec.(*specs.WipeStatusSpec)
	}

	if rec, ok := e.written.get(e.types.PowerOperation, v.id); ok && reads.has(powerRecord) {
		v.power = rec.(*specs.PowerOperationSpec)
	}

	if rec, ok := e.written.get(e.types.RebootStatus, v.id); ok && reads.has(rebootRecord) {
		v.reboot = rec.(*specs.RebootStatusSpec)
	}

	if rec, ok := e.written.get(e.types.MachineObservation, v.id); ok && reads.has(observationRecord) {
		v.obs = rec.(*specs.MachineObservationSpec)
	}

	if rec, ok := e.written.get(e.types.MachineInventory, v.id); ok && reads.has(inventoryRecord) {
		v.inv = rec.(*specs.MachineInventorySpec)
	}
}
