package dhcp_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Each firmware class boots machines of one architecture: BIOS machines are x86-64 ones.
func TestFirmwareArch(t *testing.T) {
	t.Parallel()

	for f, want := range map[dhcp.Firmware]metal.Arch{
		dhcp.FirmwareBIOS: metal.AMD64, dhcp.FirmwareUEFIx86: metal.AMD64, dhcp.FirmwareHTTPx86: metal.AMD64,
		dhcp.FirmwareUEFIARM64: metal.ARM64, dhcp.FirmwareHTTPARM64: metal.ARM64, dhcp.FirmwareUnknown: "",
	} {
		require.Equal(t, want, f.Arch(), f.String())
	}
}
