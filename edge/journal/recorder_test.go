package journal_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/journal"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// The recorder journals the firmware class and iPXE's build and platform as enums, with their names beside them
// for controllers that know only those.
func TestRecorderJournalsEnumsAndNames(t *testing.T) {
	t.Parallel()

	j := open(t, cfg(t.TempDir()))
	rec := journal.NewRecorder(j, zaptest.NewLogger(t))
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}

	rec.DHCPSeen(dhcp.Seen{MAC: mac, Firmware: dhcp.FirmwareUEFIx86})
	rec.BootServed(httpd.BootServed{UUID: "4c4c4544-0042-3510-8052-b4c04f384833", MAC: mac, Build: bootpb.IPXEArch_IPXE_ARCH_I386, Platform: bootpb.IPXEPlatform_IPXE_PLATFORM_PCBIOS, Mode: "agent"})

	evs, err := j.Pending(10)
	require.NoError(t, err)
	require.Len(t, evs, 2)

	d := evs[0].GetDhcpSeen()
	require.Equal(t, bootpb.FirmwareClass_FIRMWARE_CLASS_UEFI_X86, d.GetFirmwareClass())
	require.Equal(t, "uefi-x86", d.GetFirmware())

	b := evs[1].GetBootServed()
	require.Equal(t, bootpb.IPXEArch_IPXE_ARCH_I386, b.GetIpxeArch())
	require.Equal(t, bootpb.IPXEPlatform_IPXE_PLATFORM_PCBIOS, b.GetIpxePlatform())
	require.Equal(t, "i386", b.GetArch())
	require.Equal(t, "pcbios", b.GetPlatform())
}
