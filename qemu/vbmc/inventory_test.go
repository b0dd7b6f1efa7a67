package vbmc_test

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/vbmc"
)

var hardware = vbmc.Hardware{
	Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042", CPUs: 2, CPUModel: "QEMU Virtual CPU",
	MemoryGiB: 4, DiskBytes: 20 << 30, NICSpeedMbps: 1000, BIOSVersion: "1.16.3", BMCFirmware: "vbmc-1.0",
}

// TestInventory reads the inventory with the edge's BMC manager: everything over Redfish, the FRU data's vendor,
// model and serial over IPMI.
func TestInventory(t *testing.T) {
	t.Parallel()

	ch := vbmc.NewChassis()
	srv := httptest.NewServer(vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password, Hardware: &hardware}))
	t.Cleanup(srv.Close)

	ipmiBMC, err := vbmc.NewIPMI(ch, user, password)
	require.NoError(t, err)
	require.NoError(t, ipmiBMC.SetHardware(hardware))

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- ipmiBMC.Serve(ctx, conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	mgr := newManager(t, nil, nil)

	inv, err := mgr.Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", RedfishEndpoint: srv.URL, Protocol: bmc.ProtocolRedfish}, creds)
	require.NoError(t, err)
	require.Equal(t, bmc.Inventory{
		Protocol: bmc.ProtocolRedfish, Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042",
		CPUCount: 2, CPUModel: "QEMU Virtual CPU", MemoryGiB: 4, DiskCount: 1, DiskBytes: []uint64{20 << 30},
		NICSpeedsMbps: []uint32{1000}, BIOSVersion: "1.16.3", BMCFirmware: "vbmc-1.0",
		Firmware: []bmc.FirmwareVersion{{Name: "BIOS", Version: "1.16.3"}, {Name: "BMC", Version: "vbmc-1.0"}},
	}, inv)

	port := conn.LocalAddr().(*net.UDPAddr).Port

	inv, err = mgr.Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: port, Protocol: bmc.ProtocolIPMI}, creds)
	require.NoError(t, err)
	require.Equal(t, bmc.Inventory{Protocol: bmc.ProtocolIPMI, Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042"}, inv)

	// without FRU data an IPMI BMC has no inventory to give: a clear error
	plain := newMachine(t, false)

	_, err = mgr.Inventory(t.Context(), plain.target(bmc.ProtocolIPMI), creds)
	require.ErrorContains(t, err, "read inventory on bmc 127.0.0.1")
}
