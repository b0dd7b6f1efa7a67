package metal_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/metal"
)

func TestParseID(t *testing.T) {
	t.Parallel()

	id, err := metal.ParseID("4C4C4544-0042-3510-8052-B4C04F384833")
	require.NoError(t, err)
	require.Equal(t, "4c4c4544-0042-3510-8052-b4c04f384833", id)

	for _, bad := range []string{"", "4c4c4544", "4c4c4544-0042-3510-8052-b4c04f38483g", "4c4c4544_0042-3510-8052-b4c04f384833",
		"{4c4c4544-0042-3510-8052-b4c04f3848}", "4c4c4544-0042-3510-8052-b4c04f384833\n"} {
		_, err := metal.ParseID(bad)
		require.ErrorIs(t, err, metal.ErrMalformedID, "%q", bad)
	}

	require.Equal(t, "4c4c4544-0042-3510-8052-b4c04f384833", metal.NormalizeID(" {4C4C4544-0042-3510-8052-B4C04F384833} "))
}

func TestArchAndFirmware(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]metal.Arch{"i386": metal.AMD64, "x86_64": metal.AMD64, "amd64": metal.AMD64,
		"arm64": metal.ARM64, "aarch64": metal.ARM64} {
		got, ok := metal.ParseArch(in)
		require.True(t, ok, in)
		require.Equal(t, want, got, in)
	}

	_, ok := metal.ParseArch("riscv64")
	require.False(t, ok)
	require.Equal(t, "x86_64", metal.AMD64.IPXE())
	require.Equal(t, "arm64", metal.ARM64.IPXE())

	fw, ok := metal.FirmwareFromPlatform("pcbios")
	require.True(t, ok)
	require.Equal(t, metal.BIOS, fw)

	fw, ok = metal.FirmwareFromPlatform("efi")
	require.True(t, ok)
	require.Equal(t, metal.UEFI, fw)

	_, ok = metal.FirmwareFromPlatform("EFI")
	require.False(t, ok)
}

func FuzzParseID(f *testing.F) {
	f.Add("4c4c4544-0042-3510-8052-b4c04f384833")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := metal.ParseID(s)
		if err != nil {
			return
		}

		again, err := metal.ParseID(id)
		require.NoError(t, err)
		require.Equal(t, id, again, "parsing is idempotent")
	})
}

func TestFirmwareFromDHCPClass(t *testing.T) {
	t.Parallel()

	for class, want := range map[string]metal.Firmware{"bios": metal.BIOS, "uefi-x86": metal.UEFI, "uefi-arm64": metal.UEFI,
		"http-x86": metal.UEFI, "http-arm64": metal.UEFI} {
		got, ok := metal.FirmwareFromDHCPClass(class)
		require.True(t, ok, class)
		require.Equal(t, want, got, class)
	}

	for _, bad := range []string{"", "uefi-", "uefi-riscv", "BIOS", "http-x86 "} {
		_, ok := metal.FirmwareFromDHCPClass(bad)
		require.False(t, ok, "%q", bad)
	}
}
