package vbmc_test

import (
	"context"
	"net"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/vbmc"
)

var hardware = vbmc.Hardware{
	Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042", CPUs: 2, CPUModel: "QEMU Virtual CPU",
	MemoryGiB: 4, DiskBytes: 20 << 30, NICSpeedMbps: 1000, BIOSVersion: "1.16.3", BMCFirmware: "vbmc-1.0",
	SecureBoot: true,
}

// serveIPMI serves an IPMI BMC for ch on loopback until the test ends.
func serveIPMI(t *testing.T, ch *vbmc.Chassis) (*vbmc.IPMI, int) {
	t.Helper()

	b, err := vbmc.NewIPMI(ch, user, password)
	require.NoError(t, err)

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- b.Serve(ctx, conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	return b, conn.LocalAddr().(*net.UDPAddr).Port
}

// TestInventory reads the inventory with the edge's BMC manager: everything over Redfish, the FRU data's vendor,
// model and serial over IPMI.
func TestInventory(t *testing.T) {
	t.Parallel()

	ch := vbmc.NewChassis()
	srv := httptest.NewServer(vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: user, Password: password, Hardware: &hardware}))
	t.Cleanup(srv.Close)

	ipmiBMC, port := serveIPMI(t, ch)
	require.NoError(t, ipmiBMC.SetHardware(hardware))

	mgr := newManager(t, nil, nil)

	inv, err := mgr.Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", RedfishEndpoint: srv.URL, Protocol: bmc.ProtocolRedfish}, creds)
	require.NoError(t, err)
	require.Equal(t, bmc.Inventory{
		Protocol: bmc.ProtocolRedfish, Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042",
		CPUCount: 2, CPUModel: "QEMU Virtual CPU", MemoryGiB: 4, DiskCount: 1, DiskBytes: []uint64{20 << 30},
		NICSpeedsMbps: []uint32{1000}, BIOSVersion: "1.16.3", BMCFirmware: "vbmc-1.0",
		Firmware:   []bmc.FirmwareVersion{{Name: "BIOS", Version: "1.16.3"}, {Name: "BMC", Version: "vbmc-1.0"}},
		SecureBoot: new(true),
	}, inv)

	// a machine whose firmware does not enforce Secure Boot says so too
	off := hardware
	off.SecureBoot = false
	offSrv := httptest.NewServer(vbmc.NewRedfish(vbmc.NewChassis(), vbmc.RedfishOptions{User: user, Password: password, Hardware: &off}))
	t.Cleanup(offSrv.Close)

	inv, err = mgr.Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", RedfishEndpoint: offSrv.URL, Protocol: bmc.ProtocolRedfish}, creds)
	require.NoError(t, err)
	require.Equal(t, new(false), inv.SecureBoot)

	inv, err = mgr.Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: port, Protocol: bmc.ProtocolIPMI}, creds)
	require.NoError(t, err)
	require.Equal(t, bmc.Inventory{Protocol: bmc.ProtocolIPMI, Manufacturer: "Outpost Lab", Model: "VM-2000", SerialNumber: "SN-0042"}, inv)

	// without FRU data an IPMI BMC has no inventory to give: a clear error
	plain := newMachine(t, false)

	_, err = mgr.Inventory(t.Context(), plain.target(bmc.ProtocolIPMI), creds)
	require.ErrorContains(t, err, "read inventory on bmc 127.0.0.1")
}

// TestInventoryHostileFRU: FRU data that is huge, garbage or points past what is read gives a bounded answer or
// a clear error, quickly.
func TestInventoryHostileFRU(t *testing.T) {
	t.Parallel()

	header := func(board, product uint8) []byte {
		h := []byte{1, 0, 0, board, product, 0, 0, 0}
		sum := 0

		for _, b := range h[:7] {
			sum += int(b)
		}

		h[7] = uint8(-sum)

		return h
	}

	long := make([]byte, 60<<10)
	copy(long, header(255, 0)) // the board area at 2040, past the 2 KiB read

	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}

	// a board area whose second field runs past its end, a product area with an escape sequence in its name
	odd := append(header(1, 3), 1, 2, 0, 0, 0, 0, 0xC4, 'A', 'c', 'm', 'e', 0xDF, 'x', 'x', 'x', 'x')
	odd = append(odd, 1, 2, 0, 0xC0, 0xC6, 'H', 'i', 0x1b, '[', '2', 'J', 0xC1, 0, 0, 0, 0)

	for _, tc := range []struct {
		name    string
		data    []byte
		want    bmc.Inventory
		wantErr string
	}{
		{name: "areas past the bound", data: long, wantErr: "no readable board or product area"},
		{name: "garbage", data: garbage, wantErr: "fru common header"},
		{name: "fields past their area, escapes", data: odd, want: bmc.Inventory{Protocol: bmc.ProtocolIPMI, Manufacturer: "Acme", Model: "Hi [2J"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			b, port := serveIPMI(t, vbmc.NewChassis())
			require.NoError(t, b.SetFRUData(tc.data))

			start := time.Now()
			inv, err := newManager(t, nil, nil).Inventory(t.Context(), bmc.Target{Host: "127.0.0.1", IPMIPort: port, Protocol: bmc.ProtocolIPMI}, creds)
			require.Less(t, time.Since(start), 5*time.Second)

			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, inv)
		})
	}
}

// TestSecureBootWithSushy: Debian's Redfish library (OpenStack's sushy, which Ironic drives BMCs with) reads the
// virtual BMC's SecureBoot resource as it reads a server's: enabled, in effect for the current boot, user mode;
// and a machine whose firmware does not enforce it reads as disabled.
func TestSecureBootWithSushy(t *testing.T) {
	t.Parallel()

	if _, err := exec.LookPath("sushycli"); err != nil {
		t.Skip("sushy not installed (Debian package python3-sushy-cli)")
	}

	script := `import sys, sushy
s = sushy.Sushy(sys.argv[1], username=sys.argv[2], password=sys.argv[3])
sb = s.get_system("/redfish/v1/Systems/1").secure_boot
print(sb.enabled, sb.current_boot, sb.mode)
`

	for _, on := range []bool{true, false} {
		hw := hardware
		hw.SecureBoot = on

		srv := httptest.NewServer(vbmc.NewRedfish(vbmc.NewChassis(), vbmc.RedfishOptions{User: user, Password: password, Hardware: &hw}))
		t.Cleanup(srv.Close)

		out, err := exec.CommandContext(t.Context(), "/usr/bin/python3", "-c", script, srv.URL+"/redfish/v1", user, password).CombinedOutput()
		require.NoError(t, err, "%s", out)

		// sushy maps the values onto its enums (None for a value the schema does not have)
		want := "True SecureBootCurrentBoot.ENABLED SecureBootMode.USER"
		if !on {
			want = "False SecureBootCurrentBoot.DISABLED SecureBootMode.USER"
		}

		require.Equal(t, want, strings.TrimSpace(string(out)), "sushy reads the SecureBoot resource")
	}
}
