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
	require.Equal(t, metal.ID("4c4c4544-0042-3510-8052-b4c04f384833"), id)

	for _, bad := range []string{"", "4c4c4544", "4c4c4544-0042-3510-8052-b4c04f38483g", "4c4c4544_0042-3510-8052-b4c04f384833",
		"{4c4c4544-0042-3510-8052-b4c04f3848}", "4c4c4544-0042-3510-8052-b4c04f384833\n"} {
		_, err := metal.ParseID(bad)
		require.ErrorIs(t, err, metal.ErrMalformedID, "%q", bad)
	}

	require.Equal(t, "4c4c4544-0042-3510-8052-b4c04f384833", metal.NormalizeID(" {4C4C4544-0042-3510-8052-B4C04F384833} "))

	id, err = metal.ParsePeerID(" {4C4C4544-0042-3510-8052-B4C04F384833} ")
	require.NoError(t, err)
	require.Equal(t, metal.ID("4c4c4544-0042-3510-8052-b4c04f384833"), id)

	_, err = metal.ParsePeerID("{4c4c4544-0042-3510-8052-b4c04f3848}")
	require.ErrorIs(t, err, metal.ErrMalformedID)
}

func TestArchIPXEName(t *testing.T) {
	t.Parallel()

	require.Equal(t, "x86_64", metal.AMD64.IPXE())
	require.Equal(t, "arm64", metal.ARM64.IPXE())
}

func TestParseArch(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]metal.Arch{"amd64": metal.AMD64, "arm64": metal.ARM64} {
		got, err := metal.ParseArch(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}

	for _, bad := range []string{"", "x86_64", "aarch64", "i386", "amd64 ", "ARM64"} {
		_, err := metal.ParseArch(bad)
		require.ErrorIs(t, err, metal.ErrUnknownArch, "%q", bad)
	}
}

func TestParseFirmware(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]metal.Firmware{"bios": metal.BIOS, "uefi": metal.UEFI, "UEFI": metal.UEFI} {
		got, err := metal.ParseFirmware(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}

	for _, bad := range []string{"", "efi", "pcbios", "legacy"} {
		_, err := metal.ParseFirmware(bad)
		require.ErrorIs(t, err, metal.ErrUnknownFirmware, "%q", bad)
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("4c4c4544-0042-3510-8052-b4c04f384833")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := metal.ParseID(s)
		if err != nil {
			return
		}

		again, err := metal.ParseID(string(id))
		require.NoError(t, err)
		require.Equal(t, id, again, "parsing is idempotent")
	})
}
