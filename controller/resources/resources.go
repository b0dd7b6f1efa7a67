// Package resources defines the controller's own COSI resource types.
//
// Sites live in the Namespace namespace (persisted); their live connection state lives in EphemeralNamespace.
package resources

import (
	"fmt"
	"sync"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
)

const (
	// Namespace holds the controller's persistent resources (sites and their enrollment state).
	Namespace resource.Namespace = "outpost"
	// EphemeralNamespace holds state that is rebuilt at start (connections).
	EphemeralNamespace resource.Namespace = "outpost-ephemeral"
)

var registerOnce = sync.OnceValue(func() error {
	for _, r := range []struct {
		typ resource.Type
		reg func(resource.Type) error
	}{
		{SiteType, func(t resource.Type) error { return protobuf.RegisterResource(t, &Site{}) }},
		{SiteStatusType, func(t resource.Type) error { return protobuf.RegisterResource(t, &SiteStatus{}) }},
	} {
		if err := r.reg(r.typ); err != nil {
			return fmt.Errorf("register resource %s: %w", r.typ, err)
		}
	}

	return nil
})

// Register registers the protobuf codecs of the controller's resource types (needed by persistent
// and remote state). It is safe to call more than once.
func Register() error {
	return registerOnce()
}
