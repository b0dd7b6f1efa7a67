package lifecycle_test

import (
	"testing"

	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/machines"
)

// TestImageSiteBootsFromVirtualMedia: at a site without DHCP every boot the edge serves (agent, install) is one
// from the plan's virtual-media image, never a network boot, and a boot of the disk has the image ejected
// first (the fake's firmware, like one that prefers removable media, would boot it again).
func TestImageSiteBootsFromVirtualMedia(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	require.NoError(t, h.policies.Set("site-a", machines.SitePolicy{BootFromImage: true}))

	h.ready("m1", "site-a")
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.ClusterTalosVersion = "v1.11.0" })
	h.eventually("booted the installer", func() bool { return h.edge.Machine("m1").Booted == "install" })

	require.Zero(t, h.edge.Count("m1", "SetPXEOnce"), "no network boot at a site without dhcp")
	require.Equal(t, []string{"BootFromImage install"}, h.edge.Calls("m1", "BootFromImage"))

	h.edge.InstallToDisk("m1")
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.InstallEventId = 1 })
	h.eventually("disk plan", func() bool { return h.edge.Machine("m1").Acked.Mode == bootplans.ModeDisk })

	// A user's reboot boots the disk: the install image is ejected before the cycle.
	h.omni("m1", func(s *omnispecs.InfraMachineSpec) { s.RequestedRebootId = "reboot-1" })
	h.statusIs("m1", func(s *omnispecs.InfraMachineStatusSpec, a *assert.Assertions) { a.Equal("reboot-1", s.LastRebootId) })

	require.Equal(t, 1, h.edge.Count("m1", "EjectImage"))
	require.Equal(t, "disk", h.edge.Machine("m1").Booted, "the disk booted, not the image again")
	require.Zero(t, h.edge.Count("m1", "SetPXEOnce"))
}

// TestImageSiteOthersUnchanged: the policy is the site's own; a machine elsewhere network boots as before.
func TestImageSiteOthersUnchanged(t *testing.T) {
	t.Parallel()

	h := newHarness(t)
	require.NoError(t, h.policies.Set("site-a", machines.SitePolicy{BootFromImage: true}))

	h.ready("m2", "site-b")
	h.omni("m2", func(s *omnispecs.InfraMachineSpec) { s.PreferredPowerState = omnispecs.InfraMachineSpec_POWER_STATE_ON })
	h.eventually("powered on", func() bool { return h.edge.Machine("m2").Power })

	require.Zero(t, h.edge.Count("m2", "BootFromImage")+h.edge.Count("m2", "EjectImage"))
	require.Equal(t, []string{"PowerOn acked=agent pxe=true"}, h.edge.Calls("m2", "PowerOn"))
}
