// Lifecycle resources: in Omni mode they live in the provider's
// namespace (infra-provider:<id>) and their type names carry the provider ID, as Omni expects of infra providers
// (<Name>.<id>.infraprovider.sidero.dev); Types builds them for one provider ID.

package resources

import (
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/resource/typed"
	"github.com/siderolabs/omni/client/pkg/infra"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// BMCConfiguration is how the controller reaches a machine's BMC (ID = machine UUID).
type BMCConfiguration = typed.Resource[BMCConfigurationSpec, lifecycleExtension]

// BMCConfigurationSpec wraps specs.BMCConfigurationSpec.
type BMCConfigurationSpec = protobuf.ResourceSpec[specs.BMCConfigurationSpec, *specs.BMCConfigurationSpec]

// WipeStatus is the last completed wipe of a machine (ID = machine UUID).
type WipeStatus = typed.Resource[WipeStatusSpec, lifecycleExtension]

// WipeStatusSpec wraps specs.WipeStatusSpec.
type WipeStatusSpec = protobuf.ResourceSpec[specs.WipeStatusSpec, *specs.WipeStatusSpec]

// PowerOperation records the controller's power decisions for a machine (ID = machine UUID).
type PowerOperation = typed.Resource[PowerOperationSpec, lifecycleExtension]

// PowerOperationSpec wraps specs.PowerOperationSpec.
type PowerOperationSpec = protobuf.ResourceSpec[specs.PowerOperationSpec, *specs.PowerOperationSpec]

// RebootStatus records the last reboot the controller issued (ID = machine UUID).
type RebootStatus = typed.Resource[RebootStatusSpec, lifecycleExtension]

// RebootStatusSpec wraps specs.RebootStatusSpec.
type RebootStatusSpec = protobuf.ResourceSpec[specs.RebootStatusSpec, *specs.RebootStatusSpec]

// MachineObservation is what the controller last observed about a machine through its site (ID = machine UUID).
type MachineObservation = typed.Resource[MachineObservationSpec, lifecycleExtension]

// MachineObservationSpec wraps specs.MachineObservationSpec.
type MachineObservationSpec = protobuf.ResourceSpec[specs.MachineObservationSpec, *specs.MachineObservationSpec]

// MachineInventory is a machine's hardware as its BMC reported it (ID = machine UUID).
type MachineInventory = typed.Resource[MachineInventorySpec, lifecycleExtension]

// MachineInventorySpec wraps specs.MachineInventorySpec.
type MachineInventorySpec = protobuf.ResourceSpec[specs.MachineInventorySpec, *specs.MachineInventorySpec]

// MachineLocation is where a machine was last seen and how it boots (ID = machine UUID): the controller's
// durable knowledge of machines, loaded before any decision after a restart.
type MachineLocation = typed.Resource[MachineLocationSpec, lifecycleExtension]

// MachineLocationSpec wraps specs.MachineLocationSpec.
type MachineLocationSpec = protobuf.ResourceSpec[specs.MachineLocationSpec, *specs.MachineLocationSpec]

// MachineLocationSchema is the MachineLocationSpec format this controller writes and understands.
const MachineLocationSchema = 1

// EnrollmentCA is the controller's enrollment CA, its key sealed (ID = EnrollmentCAID).
type EnrollmentCA = typed.Resource[EnrollmentCASpec, lifecycleExtension]

// EnrollmentCASpec wraps specs.EnrollmentCASpec.
type EnrollmentCASpec = protobuf.ResourceSpec[specs.EnrollmentCASpec, *specs.EnrollmentCASpec]

// EnrollmentCAID is the ID of the one EnrollmentCA of a provider.
const EnrollmentCAID = "enrollment"

// EnrollmentCASchema is the EnrollmentCASpec format this controller writes and understands.
const EnrollmentCASchema = 1

// ControllerLease says which of the provider's controllers acts (ID = ControllerLeaseID).
type ControllerLease = typed.Resource[ControllerLeaseSpec, lifecycleExtension]

// ControllerLeaseSpec wraps specs.ControllerLeaseSpec.
type ControllerLeaseSpec = protobuf.ResourceSpec[specs.ControllerLeaseSpec, *specs.ControllerLeaseSpec]

// ControllerLeaseID is the ID of the one ControllerLease of a provider.
const ControllerLeaseID = "active"

// lifecycleExtension gives the lifecycle resources a resource definition. Their real type names depend on
// the provider ID and are carried by each resource's metadata (see Types); the definition is informational.
type lifecycleExtension struct{}

// ResourceDefinition implements typed.Extension.
func (lifecycleExtension) ResourceDefinition() meta.ResourceDefinitionSpec {
	return meta.ResourceDefinitionSpec{Type: "LifecycleResources.outpost.infraprovider.sidero.dev"}
}

// Types names the lifecycle resources of one provider ID and creates them in its namespace.
type Types struct {
	ProviderID         string
	Namespace          resource.Namespace
	BMCConfiguration   resource.Type
	WipeStatus         resource.Type
	PowerOperation     resource.Type
	RebootStatus       resource.Type
	MachineObservation resource.Type
	MachineInventory   resource.Type
	// MachineLocation is not among All: a location reaches the lifecycle through the SiteLocator.
	MachineLocation resource.Type
	// Site and EnrollmentCA hold the controller's sites and enrollment CA (see Sites, NewEnrollmentCA).
	Site         resource.Type
	EnrollmentCA resource.Type
	// ControllerLease says which of the provider's controllers acts (controller/lease).
	ControllerLease resource.Type
}

// NewTypes returns the resource types of provider providerID.
func NewTypes(providerID string) Types {
	return Types{
		ProviderID:         providerID,
		Namespace:          infra.ResourceNamespace(providerID),
		BMCConfiguration:   infra.ResourceType("BMCConfiguration", providerID),
		WipeStatus:         infra.ResourceType("WipeStatus", providerID),
		PowerOperation:     infra.ResourceType("PowerOperation", providerID),
		RebootStatus:       infra.ResourceType("RebootStatus", providerID),
		MachineObservation: infra.ResourceType("MachineObservation", providerID),
		MachineInventory:   infra.ResourceType("MachineInventory", providerID),
		MachineLocation:    infra.ResourceType("MachineLocation", providerID),
		Site:               infra.ResourceType("Site", providerID),
		EnrollmentCA:       infra.ResourceType("EnrollmentCA", providerID),
		ControllerLease:    infra.ResourceType("ControllerLease", providerID),
	}
}

// Sites is where the provider's Site resources live in Omni.
func (t Types) Sites() SiteKind { return SiteKind{Namespace: t.Namespace, Type: t.Site} }

// All lists the lifecycle resource types.
func (t Types) All() []resource.Type {
	return []resource.Type{t.BMCConfiguration, t.WipeStatus, t.PowerOperation, t.RebootStatus, t.MachineObservation, t.MachineInventory}
}

// Register registers the protobuf codecs of the lifecycle types (needed before they cross gRPC); registering
// the same provider's types twice is fine.
func (t Types) Register() error {
	for _, err := range []error{
		protobuf.RegisterResource(t.BMCConfiguration, t.NewBMCConfiguration("")),
		protobuf.RegisterResource(t.WipeStatus, t.NewWipeStatus("")),
		protobuf.RegisterResource(t.PowerOperation, t.NewPowerOperation("")),
		protobuf.RegisterResource(t.RebootStatus, t.NewRebootStatus("")),
		protobuf.RegisterResource(t.MachineObservation, t.NewMachineObservation("")),
		protobuf.RegisterResource(t.MachineInventory, t.NewMachineInventory("")),
		protobuf.RegisterResource(t.MachineLocation, t.NewMachineLocation("")),
		protobuf.RegisterResource(t.Site, t.Sites().New("")),
		protobuf.RegisterResource(t.EnrollmentCA, t.NewEnrollmentCA("")),
		protobuf.RegisterResource(t.ControllerLease, t.NewControllerLease("")),
	} {
		if err != nil && !strings.Contains(err.Error(), "already registered") {
			return err
		}
	}

	return nil
}

func (t Types) md(typ resource.Type, id string) resource.Metadata {
	return resource.NewMetadata(t.Namespace, typ, id, resource.VersionUndefined)
}

// NewBMCConfiguration returns an empty BMCConfiguration for machine id.
func (t Types) NewBMCConfiguration(id string) *BMCConfiguration {
	return typed.NewResource[BMCConfigurationSpec, lifecycleExtension](t.md(t.BMCConfiguration, id),
		protobuf.NewResourceSpec(&specs.BMCConfigurationSpec{}))
}

// NewWipeStatus returns an empty WipeStatus for machine id.
func (t Types) NewWipeStatus(id string) *WipeStatus {
	return typed.NewResource[WipeStatusSpec, lifecycleExtension](t.md(t.WipeStatus, id),
		protobuf.NewResourceSpec(&specs.WipeStatusSpec{}))
}

// NewPowerOperation returns an empty PowerOperation for machine id.
func (t Types) NewPowerOperation(id string) *PowerOperation {
	return typed.NewResource[PowerOperationSpec, lifecycleExtension](t.md(t.PowerOperation, id),
		protobuf.NewResourceSpec(&specs.PowerOperationSpec{}))
}

// NewRebootStatus returns an empty RebootStatus for machine id.
func (t Types) NewRebootStatus(id string) *RebootStatus {
	return typed.NewResource[RebootStatusSpec, lifecycleExtension](t.md(t.RebootStatus, id),
		protobuf.NewResourceSpec(&specs.RebootStatusSpec{}))
}

// NewMachineObservation returns an empty MachineObservation for machine id.
func (t Types) NewMachineObservation(id string) *MachineObservation {
	return typed.NewResource[MachineObservationSpec, lifecycleExtension](t.md(t.MachineObservation, id),
		protobuf.NewResourceSpec(&specs.MachineObservationSpec{}))
}

// NewMachineInventory returns an empty MachineInventory for machine id.
func (t Types) NewMachineInventory(id string) *MachineInventory {
	return typed.NewResource[MachineInventorySpec, lifecycleExtension](t.md(t.MachineInventory, id),
		protobuf.NewResourceSpec(&specs.MachineInventorySpec{}))
}

// NewMachineLocation returns an empty MachineLocation for machine id.
func (t Types) NewMachineLocation(id string) *MachineLocation {
	return typed.NewResource[MachineLocationSpec, lifecycleExtension](t.md(t.MachineLocation, id),
		protobuf.NewResourceSpec(&specs.MachineLocationSpec{}))
}

// NewEnrollmentCA returns an empty EnrollmentCA with the given ID (EnrollmentCAID).
func (t Types) NewEnrollmentCA(id string) *EnrollmentCA {
	return typed.NewResource[EnrollmentCASpec, lifecycleExtension](t.md(t.EnrollmentCA, id),
		protobuf.NewResourceSpec(&specs.EnrollmentCASpec{}))
}

// NewControllerLease returns an empty ControllerLease with the given ID (ControllerLeaseID).
func (t Types) NewControllerLease(id string) *ControllerLease {
	return typed.NewResource[ControllerLeaseSpec, lifecycleExtension](t.md(t.ControllerLease, id),
		protobuf.NewResourceSpec(&specs.ControllerLeaseSpec{}))
}
