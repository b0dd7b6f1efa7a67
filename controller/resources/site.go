package resources

import (
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/resource/typed"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// SiteType is the type of Site resources.
const SiteType = resource.Type("Sites.outpost.sidero.dev")

// Site is a site the controller knows: its join token (hashed) and the certificates issued to its edge. ID = site ID.
type Site = typed.Resource[SiteSpec, SiteExtension]

// SiteSpec wraps specs.SiteSpec.
type SiteSpec = protobuf.ResourceSpec[specs.SiteSpec, *specs.SiteSpec]

// SiteKind says where Site resources live: in the controller's own store (LocalSites), or in Omni (Types.Sites),
// where the provider's namespace holds them under a provider-scoped type, as Omni requires of an infra
// provider's own resources. The spec is the same in both.
type SiteKind struct {
	Namespace resource.Namespace
	Type      resource.Type
}

// LocalSites are the Sites of a controller that keeps them in its own state directory.
var LocalSites = SiteKind{Namespace: Namespace, Type: SiteType}

// New returns an empty Site with the given ID.
func (k SiteKind) New(id string) *Site {
	return typed.NewResource[SiteSpec, SiteExtension](
		resource.NewMetadata(k.Namespace, k.Type, id, resource.VersionUndefined),
		protobuf.NewResourceSpec(&specs.SiteSpec{}),
	)
}

// SiteExtension provides the resource definition of Site.
type SiteExtension struct{}

// ResourceDefinition implements typed.Extension.
func (SiteExtension) ResourceDefinition() meta.ResourceDefinitionSpec {
	return meta.ResourceDefinitionSpec{
		Type:             SiteType,
		DefaultNamespace: Namespace,
		Sensitivity:      meta.Sensitive,
	}
}

// SiteStatusType is the type of SiteStatus resources.
const SiteStatusType = resource.Type("SiteStatuses.outpost.sidero.dev")

// SiteStatus is the live connection state of a site's edge. ID = site ID.
type SiteStatus = typed.Resource[SiteStatusSpec, SiteStatusExtension]

// SiteStatusSpec wraps specs.SiteStatusSpec.
type SiteStatusSpec = protobuf.ResourceSpec[specs.SiteStatusSpec, *specs.SiteStatusSpec]

// NewSiteStatus returns an empty SiteStatus with the given ID.
func NewSiteStatus(id string) *SiteStatus {
	return typed.NewResource[SiteStatusSpec, SiteStatusExtension](
		resource.NewMetadata(EphemeralNamespace, SiteStatusType, id, resource.VersionUndefined),
		protobuf.NewResourceSpec(&specs.SiteStatusSpec{}),
	)
}

// SiteStatusExtension provides the resource definition of SiteStatus.
type SiteStatusExtension struct{}

// ResourceDefinition implements typed.Extension.
func (SiteStatusExtension) ResourceDefinition() meta.ResourceDefinitionSpec {
	return meta.ResourceDefinitionSpec{
		Type:             SiteStatusType,
		DefaultNamespace: EphemeralNamespace,
	}
}
