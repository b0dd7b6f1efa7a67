package resources

import (
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/resource/typed"
	"github.com/siderolabs/omni/client/pkg/infra"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// MachineTimeline is what happened to a machine, for operators (ID = machine UUID). It lives beside the
// lifecycle records in the provider's namespace, so a restarted controller still shows a machine's last boot.
type MachineTimeline = typed.Resource[MachineTimelineSpec, lifecycleExtension]

// MachineTimelineSpec wraps specs.MachineTimelineSpec.
type MachineTimelineSpec = protobuf.ResourceSpec[specs.MachineTimelineSpec, *specs.MachineTimelineSpec]

// MachineTimelineSchema is the MachineTimelineSpec format this controller writes and understands.
const MachineTimelineSchema = 1

// MachineTimeline is the type of the provider's MachineTimeline resources. It is not among All: timelines
// are written for operators and never read by the lifecycle's decisions.
func (t Types) MachineTimeline() resource.Type {
	return infra.ResourceType("MachineTimeline", t.ProviderID)
}

// NewMachineTimeline returns an empty MachineTimeline for machine id.
func (t Types) NewMachineTimeline(id string) *MachineTimeline {
	return typed.NewResource[MachineTimelineSpec, lifecycleExtension](t.md(t.MachineTimeline(), id),
		protobuf.NewResourceSpec(&specs.MachineTimelineSpec{}))
}

// RegisterTimeline registers the protobuf codec of MachineTimeline (needed before it crosses gRPC);
// registering it twice is fine.
func (t Types) RegisterTimeline() error {
	if err := protobuf.RegisterResource(t.MachineTimeline(), t.NewMachineTimeline("")); err != nil &&
		!strings.Contains(err.Error(), "already registered") {
		return err
	}

	return nil
}
