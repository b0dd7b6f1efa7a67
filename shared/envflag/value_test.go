package envflag_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/metal"
)

// A parsed flag holds what its parser made of the text, refuses what the parser refuses (keeping its value) and
// prints its value back; parsed through a flag set, a bad value is an error of the parse.
func TestParsed(t *testing.T) {
	t.Parallel()

	a := metal.AMD64
	v := envflag.Parsed(&a, "arch", metal.ParseArch, metal.Arch.String)
	require.Equal(t, "amd64", v.String())
	require.NoError(t, v.Set("arm64"))
	require.Equal(t, metal.ARM64, a)
	require.ErrorIs(t, v.Set("x86_64"), metal.ErrUnknownArch)
	require.Equal(t, metal.ARM64, a, "a refused value changes nothing")
	require.Equal(t, "arch", v.Type())

	fw := metal.UEFI
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.Var(envflag.Parsed(&fw, "firmware", metal.ParseFirmware, metal.Firmware.String), "boot-mode", "")
	require.NoError(t, fs.Parse([]string{"--boot-mode", "BIOS"}))
	require.Equal(t, metal.BIOS, fw)
	require.ErrorIs(t, fs.Parse([]string{"--boot-mode", "efi"}), metal.ErrUnknownFirmware)
	require.Equal(t, metal.BIOS, fw)
}
