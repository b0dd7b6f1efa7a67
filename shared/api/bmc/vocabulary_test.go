package bmc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// A boot mode maps to the one firmware vocabulary and back; unspecified maps to none.
func TestBootModeFirmware(t *testing.T) {
	t.Parallel()

	for _, f := range []metal.Firmware{metal.BIOS, metal.UEFI} {
		got, ok := bmcpb.BootModeOf(f).Firmware()
		require.True(t, ok, f)
		require.Equal(t, f, got)
	}

	require.Equal(t, bmcpb.BootMode_BOOT_MODE_UNSPECIFIED, bmcpb.BootModeOf("auto"))

	_, ok := bmcpb.BootMode_BOOT_MODE_UNSPECIFIED.Firmware()
	require.False(t, ok)
}

// A watched machine's state reads the same from a v0.3.0 edge (name only) as from a newer one (both).
func TestWatchedPowerState(t *testing.T) {
	t.Parallel()

	for _, s := range []bmcpb.PowerState{bmcpb.PowerState_POWER_STATE_ON, bmcpb.PowerState_POWER_STATE_OFF, bmcpb.PowerState_POWER_STATE_UNKNOWN} {
		sent := bmcpb.NewWatchedPower("m1", s)
		require.Equal(t, s, sent.ReportedState())
		require.Equal(t, s, (&bmcpb.WatchedPower{State: sent.GetState()}).ReportedState(), "a v0.3.0 edge sends %q", sent.GetState())
	}

	require.Equal(t, bmcpb.PowerState_POWER_STATE_UNSPECIFIED, (&bmcpb.WatchedPower{State: "sleeping"}).ReportedState())
}
