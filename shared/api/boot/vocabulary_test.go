package boot_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// The boot events' enums map to the machine's vocabulary; an older edge's event, with names only, maps the same
// way, and the enum wins where both are set.
func TestBootEventVocabulary(t *testing.T) {
	t.Parallel()

	for name, want := range map[string]metal.Firmware{
		"bios": metal.BIOS, "uefi-x86": metal.UEFI, "uefi-arm64": metal.UEFI, "http-x86": metal.UEFI, "http-arm64": metal.UEFI,
	} {
		class := bootpb.FirmwareClassNamed(name)
		require.Equal(t, name, class.Name())

		for _, ev := range []*bootpb.DHCPSeen{{FirmwareClass: class}, {Firmware: name}} {
			got, ok := ev.MachineFirmware()
			require.True(t, ok, name)
			require.Equal(t, want, got, name)
		}
	}

	for _, bad := range []string{"", "unknown", "BIOS", "uefi-", "http-x86 "} {
		_, ok := (&bootpb.DHCPSeen{Firmware: bad}).MachineFirmware()
		require.False(t, ok, "%q", bad)
	}

	both := &bootpb.DHCPSeen{Firmware: "bios", FirmwareClass: bootpb.FirmwareClass_FIRMWARE_CLASS_UEFI_X86}
	require.Equal(t, bootpb.FirmwareClass_FIRMWARE_CLASS_UEFI_X86, both.Class(), "the enum wins")

	for name, want := range map[string]metal.Arch{"i386": metal.AMD64, "x86_64": metal.AMD64, "arm64": metal.ARM64} {
		for _, ev := range []*bootpb.BootServed{{IpxeArch: bootpb.IPXEArchNamed(name)}, {Arch: name}} {
			got, ok := ev.MachineArch()
			require.True(t, ok, name)
			require.Equal(t, want, got, name)
			require.Equal(t, name, ev.ReportedArch().Name())
		}
	}

	for _, bad := range []string{"", "amd64", "aarch64", "riscv64", "X86_64"} {
		_, ok := (&bootpb.BootServed{Arch: bad}).MachineArch()
		require.False(t, ok, "%q is not an iPXE build", bad)
	}

	for name, want := range map[string]metal.Firmware{"pcbios": metal.BIOS, "efi": metal.UEFI} {
		for _, ev := range []*bootpb.BootServed{{IpxePlatform: bootpb.IPXEPlatformNamed(name)}, {Platform: name}} {
			got, ok := ev.MachineFirmware()
			require.True(t, ok, name)
			require.Equal(t, want, got, name)
		}
	}

	_, ok := (&bootpb.BootServed{Platform: "EFI"}).MachineFirmware()
	require.False(t, ok)
}

// Any name an edge sends maps to a value whose name it is, or to none.
func FuzzVocabularyNames(f *testing.F) {
	for _, s := range []string{"bios", "uefi-x86", "x86_64", "i386", "efi", "pcbios", "", "\x00"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, name string) {
		for _, got := range []string{
			bootpb.FirmwareClassNamed(name).Name(), bootpb.IPXEArchNamed(name).Name(), bootpb.IPXEPlatformNamed(name).Name(),
		} {
			if got != "" && got != name {
				t.Fatalf("%q mapped to a value named %q", name, got)
			}
		}
	})
}

// Power states and tunnel refusals travel as enums beside their names; an older edge's event (names only) reads
// the same, a newer event carries the name for older controllers, and a name nobody sends reads as unspecified.
func TestPowerAndRefusalVocabulary(t *testing.T) {
	t.Parallel()

	for _, name := range []string{"on", "off", "unknown"} {
		s := bmcpb.PowerStateNamed(name)
		require.NotEqual(t, bmcpb.PowerState_POWER_STATE_UNSPECIFIED, s, name)

		sent := bootpb.NewPowerChanged("m1", s, "")
		require.Equal(t, name, sent.GetState(), "a v0.3.0 controller reads the name")
		require.Equal(t, s, sent.ReportedState())
		require.Equal(t, s, (&bootpb.PowerChanged{State: name}).ReportedState(), "a v0.3.0 edge sends the name only")
	}

	require.Equal(t, bmcpb.PowerState_POWER_STATE_UNSPECIFIED, (&bootpb.PowerChanged{State: "exploded"}).ReportedState())
	require.Equal(t, bmcpb.PowerState_POWER_STATE_OFF,
		(&bootpb.PowerChanged{State: "on", PowerState: bmcpb.PowerState_POWER_STATE_OFF}).ReportedState(), "the enum wins")

	for _, name := range []string{"contested_machine_id", "source_not_boot_address", "duplicate_machine_id"} {
		r := bootpb.TunnelRefusalNamed(name)
		require.NotEqual(t, bootpb.TunnelRefusal_TUNNEL_REFUSAL_UNSPECIFIED, r, name)

		sent := bootpb.NewTunnelRefused("m1", r, "10.0.0.66")
		require.Equal(t, name, sent.GetReason(), "a v0.3.0 controller reads the name")
		require.Equal(t, r, sent.ReportedRefusal())
		require.Equal(t, r, (&bootpb.TunnelRefused{Reason: name}).ReportedRefusal(), "a v0.3.0 edge sends the name only")
	}

	require.Equal(t, bootpb.TunnelRefusal_TUNNEL_REFUSAL_UNSPECIFIED, (&bootpb.TunnelRefused{Reason: "bored"}).ReportedRefusal())
}
