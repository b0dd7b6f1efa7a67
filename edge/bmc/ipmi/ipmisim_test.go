package ipmi_test

import (
	"context"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc/internal/ipmisim"
	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	"github.com/outpost-metal/outpost/shared/metal"
)

// These tests let OpenIPMI's ipmi_sim judge the client and Debian's ipmitool read back what it did: neither was
// written here. They skip when either is missing (Debian packages openipmi and ipmitool).

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(10 * time.Second)

	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}

		select {
		case <-t.Context().Done():
			t.Fatalf("test ended waiting: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var bootData = regexp.MustCompile(`Boot parameter data: ([0-9a-fA-F]{10})`)

// bootFlags reads parameter 5 with ipmitool and returns its 5 data bytes and ipmitool's rendering.
func bootFlags(t *testing.T, sim *ipmisim.Sim) ([]byte, string) {
	t.Helper()

	out, err := sim.Ipmitool(t.Context(), "chassis", "bootparam", "get", "5")
	require.NoError(t, err)

	m := bootData.FindStringSubmatch(out)
	require.NotNil(t, m, "ipmitool's answer: %s", out)

	data, err := hex.DecodeString(m[1])
	require.NoError(t, err)

	return data, out
}

func powerIs(t *testing.T, sim *ipmisim.Sim, c *ipmi.Client, on bool) {
	t.Helper()

	want := map[bool]string{true: "Chassis Power is on", false: "Chassis Power is off"}[on]

	out, err := sim.Ipmitool(t.Context(), "chassis", "power", "status")
	require.NoError(t, err)
	require.Contains(t, out, want, "ipmitool")
	require.Equal(t, on, sim.Power(), "the chassis script")

	got, err := c.PowerStatus(t.Context())
	require.NoError(t, err)
	require.Equal(t, on, got, "the client")
}

func TestIPMISimPower(t *testing.T) {
	t.Parallel()

	sim := ipmisim.Start(t, ipmisim.Options{User: user, Password: password})

	c, err := dial(t, sim.Port, nil)
	require.NoError(t, err)
	require.Equal(t, uint8(3), c.CipherSuite(), "ipmi_sim refuses cipher suite 17; the client fell back to 3")

	powerIs(t, sim, c, false)

	require.NoError(t, c.PowerOn(t.Context()))
	powerIs(t, sim, c, true)

	require.NoError(t, c.PowerOff(t.Context()))
	powerIs(t, sim, c, false)

	// A cycle of a running machine (a machine that is off is powered on by bmc.Manager, not cycled).
	require.NoError(t, c.PowerOn(t.Context()))
	powerIs(t, sim, c, true)

	// A cycle of a running machine: ipmi_sim powers it down, and up again a second later.
	downs := strings.Count(sim.Calls(), "set power 0")

	require.NoError(t, c.PowerCycle(t.Context()))
	eventually(t, "ipmi_sim powers the chassis down and up again", func() bool {
		calls := sim.Calls()

		return strings.Count(calls, "set power 0") == downs+1 && strings.LastIndex(calls, "set power 1") > strings.LastIndex(calls, "set power 0")
	})
	powerIs(t, sim, c, true)
}

func TestIPMISimOneTimePXE(t *testing.T) {
	t.Parallel()

	sim := ipmisim.Start(t, ipmisim.Options{User: user, Password: password})

	c, err := dial(t, sim.Port, nil)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		fw   metal.Firmware
	}{
		{name: "bios", fw: metal.BIOS},
		{name: "uefi", fw: metal.UEFI},
	} {
		require.NoError(t, c.SetPXEOnce(t.Context(), tc.fw), tc.name)
		require.Equal(t, "pxe", sim.BootDevice(), "%s: ipmi_sim handed the device to its chassis program", tc.name)

		data, out := bootFlags(t, sim)
		t.Logf("%s: ipmi_sim reads parameter 5 back as % x", tc.name, data)

		require.Contains(t, out, "Boot Device Selector : Force PXE", tc.name)
		require.Equal(t, byte(types.BootDeviceSelectorForcePXE)<<2, data[1]&0x3c, "%s: data 2 holds the device", tc.name)

		sent := (&types.BootOptionParam_BootFlags{
			BootFlagsValid: true, BIOSBootType: types.BIOSBootType(tc.fw == metal.UEFI), BootDeviceSelector: types.BootDeviceSelectorForcePXE,
		}).Pack()
		require.Zero(t, data[0]&^sent[0], "%s: data 1 shows nothing that was not set (it may drop bits): % x", tc.name, data)

		// What the client reports at any later time is what the BMC says: ipmi_sim keeps no valid bit.
		set, isPXE, fw, err := c.BootOverride(t.Context())
		require.NoError(t, err)
		require.True(t, isPXE, tc.name)
		require.Equal(t, data[0]&0x80 != 0, set, tc.name)
		require.Equal(t, data[0]&0x20 != 0, fw == metal.UEFI, tc.name)
	}

	// Another tool's override is read as it is.
	_, err = sim.Ipmitool(t.Context(), "chassis", "bootdev", "disk")
	require.NoError(t, err)

	_, isPXE, _, err := c.BootOverride(t.Context())
	require.NoError(t, err)
	require.False(t, isPXE)

	require.NoError(t, c.ClearOverride(t.Context()))
	require.Equal(t, "none", sim.BootDevice())

	_, out := bootFlags(t, sim)
	require.Contains(t, out, "Boot Device Selector : No override")

	// A BMC that acknowledges the set and keeps no device: the read-back shows no override, and that fails.
	require.NoError(t, sim.IgnoreBootDevice(true))

	err = c.SetPXEOnce(t.Context(), metal.BIOS)
	require.ErrorIs(t, err, ipmi.ErrReadBack)
	require.Contains(t, err.Error(), "No override")

	_, out = bootFlags(t, sim)
	require.Contains(t, out, "Boot Device Selector : No override")
}

func TestIPMISimRefusals(t *testing.T) {
	t.Parallel()

	t.Run("no chassis control", func(t *testing.T) {
		t.Parallel()

		// Without a chassis control program (or a VM) ipmi_sim cannot power anything and says so with CCh.
		sim := ipmisim.Start(t, ipmisim.Options{User: user, Password: password, NoChassisControl: true})

		c, err := dial(t, sim.Port, nil)
		require.NoError(t, err)

		on, err := c.PowerStatus(t.Context())
		require.NoError(t, err)
		require.False(t, on)

		for name, op := range map[string]func(context.Context) error{
			"power on": c.PowerOn,
			"pxe":      func(ctx context.Context) error { return c.SetPXEOnce(ctx, metal.UEFI) },
		} {
			err := op(t.Context())

			var cce *ipmi.CompletionCodeError

			require.ErrorAs(t, err, &cce, name)
			require.Equal(t, uint8(0xcc), cce.Code, name)
			require.True(t, permanent(err), name)
			require.Contains(t, err.Error(), "completion code 0xcc (invalid data field in request)", name)
		}

		// ipmitool is refused the same way.
		_, err = sim.Ipmitool(t.Context(), "chassis", "power", "on")
		require.ErrorContains(t, err, "Invalid data field in request")
	})

	t.Run("codes", func(t *testing.T) {
		t.Parallel()

		sim := ipmisim.Start(t, ipmisim.Options{User: user, Password: password})

		c, err := dial(t, sim.Port, nil)
		require.NoError(t, err)

		for _, tc := range []struct {
			name      string
			call      func(context.Context) error
			code      uint8
			permanent bool
		}{
			{name: "unknown chassis command", code: 0xc1, permanent: true, call: func(ctx context.Context) error {
				_, err := c.Raw(ctx, types.NetFnChassisRequest, 0x0b, nil)

				return err
			}},
			{name: "boot option parameter ipmi_sim lacks", code: 0xcc, permanent: true, call: func(ctx context.Context) error {
				_, err := c.Raw(ctx, types.NetFnChassisRequest, types.CommandGetSystemBootOptions.ID, []byte{0x02, 0x00, 0x00})

				return err
			}},
			{name: "chassis program fails", code: 0xff, call: func(ctx context.Context) error {
				require.NoError(t, sim.FailChassis(true))
				defer func() { require.NoError(t, sim.FailChassis(false)) }()

				_, err := c.PowerStatus(ctx)

				return err
			}},
		} {
			err := tc.call(t.Context())

			var cce *ipmi.CompletionCodeError

			require.ErrorAs(t, err, &cce, tc.name)
			require.Equal(t, tc.code, cce.Code, tc.name)
			require.Equal(t, tc.permanent, permanent(err), tc.name)
		}

		// After a refusal the session still works.
		_, err = c.PowerStatus(t.Context())
		require.NoError(t, err)
	})

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()

		sim := ipmisim.Start(t, ipmisim.Options{User: user, Password: password})

		_, err := dial(t, sim.Port, func(cfg *ipmi.Config) { cfg.Password = "x" })
		require.Error(t, err)
		require.True(t, permanent(err), "%v", err)
		require.NotContains(t, err.Error(), "[redacted]")
	})
}
