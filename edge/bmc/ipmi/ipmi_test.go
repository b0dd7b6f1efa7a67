package ipmi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outpost-metal/outpost/edge/bmc/internal/fakebmc"
	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	user     = "operator"
	password = "hunter2-hunter2"
)

func dial(t *testing.T, port int, mutate func(*ipmi.Config)) (*ipmi.Client, error) {
	t.Helper()

	cfg := ipmi.Config{Host: "127.0.0.1", Port: port, Username: user, Password: password, Timeout: 300 * time.Millisecond}
	if mutate != nil {
		mutate(&cfg)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	c, err := ipmi.Dial(ctx, cfg)
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()

			c.Close(ctx) //nolint:errcheck
		})
	}

	return c, err
}

func pxe(fw metal.Firmware) types.BootOptionParam_BootFlags {
	return types.BootOptionParam_BootFlags{
		BootFlagsValid: true, BIOSBootType: types.BIOSBootType(fw == metal.UEFI), BootDeviceSelector: types.BootDeviceSelectorForcePXE,
	}
}

// readBacks are what BMCs answer for parameter 5 after a one-time PXE boot was set, and whether that shows it in effect.
var readBacks = []struct {
	name string
	fw   metal.Firmware
	got  func(set types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags
	ok   bool
}{
	{name: "echo legacy", fw: metal.BIOS, got: echo, ok: true},
	{name: "echo uefi", fw: metal.UEFI, got: echo, ok: true},
	{name: "ipmi_sim keeps only the device, legacy", fw: metal.BIOS, got: deviceOnly, ok: true},
	{name: "ipmi_sim keeps only the device, uefi", fw: metal.UEFI, got: deviceOnly, ok: true},
	{name: "efi bit not implemented", fw: metal.UEFI, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		f.BIOSBootType = types.BIOSBootTypeLegacy

		return f
	}, ok: true},
	{name: "another device", fw: metal.BIOS, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		f.BootDeviceSelector = types.BootDeviceSelectorForceHardDrive

		return f
	}},
	{name: "no override kept", fw: metal.UEFI, got: func(types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		return types.BootOptionParam_BootFlags{}
	}},
	{name: "no override but the mode", fw: metal.UEFI, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		return types.BootOptionParam_BootFlags{BIOSBootType: f.BIOSBootType}
	}},
	{name: "persistent", fw: metal.BIOS, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		f.Persist = true

		return f
	}},
	{name: "efi for a legacy boot", fw: metal.BIOS, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		f.BIOSBootType = types.BIOSBootTypeEFI

		return f
	}},
	{name: "valid cleared by a bmc that keeps data 1", fw: metal.UEFI, got: func(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
		f.BootFlagsValid = false

		return f
	}},
}

func echo(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags { return f }

// deviceOnly is OpenIPMI ipmi_sim's answer: data 1 = 00h, data 2 = the device (lanserv/bmc_chassis.c).
func deviceOnly(f types.BootOptionParam_BootFlags) types.BootOptionParam_BootFlags {
	return types.BootOptionParam_BootFlags{BootDeviceSelector: f.BootDeviceSelector}
}

func TestReadBackMatches(t *testing.T) {
	t.Parallel()

	for _, tc := range readBacks {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			want := pxe(tc.fw)
			require.Equal(t, tc.ok, ipmi.ReadBackMatches(want, tc.got(want)))
		})
	}
}

func TestSetPXEOnceReadBack(t *testing.T) {
	t.Parallel()

	for _, tc := range readBacks {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			b := fakebmc.Start(t, fakebmc.Options{User: user, Password: password, ReadBack: tc.got})

			c, err := dial(t, b.Port, nil)
			require.NoError(t, err)

			err = c.SetPXEOnce(t.Context(), tc.fw)
			require.Equal(t, pxe(tc.fw), b.BootFlags(), "what was sent")

			if tc.ok {
				require.NoError(t, err)

				return
			}

			require.ErrorIs(t, err, ipmi.ErrReadBack)
			require.False(t, permanent(err), "a read-back mismatch may be retried")
		})
	}
}

func permanent(err error) bool {
	var p interface{ Permanent() bool }

	return err != nil && errors.As(err, &p) && p.Permanent()
}

func TestCompletionCodes(t *testing.T) {
	t.Parallel()

	calls := map[fakebmc.Op]func(context.Context, *ipmi.Client) error{
		fakebmc.OpPowerState: func(ctx context.Context, c *ipmi.Client) error { _, err := c.PowerStatus(ctx); return err },
		fakebmc.OpSetPower:   func(ctx context.Context, c *ipmi.Client) error { return c.PowerOn(ctx) },
		fakebmc.OpSetBootFlags: func(ctx context.Context, c *ipmi.Client) error {
			return c.SetPXEOnce(ctx, metal.UEFI)
		},
		fakebmc.OpGetBootFlags: func(ctx context.Context, c *ipmi.Client) error { _, _, _, err := c.BootOverride(ctx); return err },
	}

	for _, tc := range []struct {
		op        fakebmc.Op
		cc        types.CompletionCode
		words     string
		permanent bool
	}{
		{op: fakebmc.OpSetPower, cc: types.CodeInvalidCommand, words: "invalid command", permanent: true},
		{op: fakebmc.OpSetPower, cc: types.CodeParameterOutOfRange, words: "parameter out of range", permanent: true},
		{op: fakebmc.OpSetPower, cc: types.CodeRequestDataFieldInvalid, words: "invalid data field in request", permanent: true},
		{op: fakebmc.OpPowerState, cc: types.CodeInsufficientPrivilege, words: "insufficient privilege", permanent: true},
		{op: fakebmc.OpSetBootFlags, cc: types.CodeParameterNotSupported, words: "parameter not supported", permanent: true},
		{op: fakebmc.OpGetBootFlags, cc: types.CodeParameterNotSupported, words: "parameter not supported", permanent: true},
		{op: fakebmc.OpSetBootFlags, cc: types.CodeParamConfigSetInProgressConflict, words: "set in progress", permanent: false},
		{op: fakebmc.OpPowerState, cc: types.CodeNodeBusy, words: "node busy", permanent: false},
		{op: fakebmc.OpSetPower, cc: types.CodeProcessTimeout, words: "timeout", permanent: false},
		{op: fakebmc.OpSetPower, cc: types.CodeNotSupported, words: "not supported in present state", permanent: false},
		{op: fakebmc.OpPowerState, cc: types.CodeUnspecifiedError, words: "unspecified error", permanent: false},
		{op: fakebmc.OpSetPower, cc: 0x80, words: "0x80", permanent: false}, // Chassis Control defines no 80h
	} {
		t.Run(fmt.Sprintf("%s %#02x", tc.op, uint8(tc.cc)), func(t *testing.T) {
			t.Parallel()

			b := fakebmc.Start(t, fakebmc.Options{User: user, Password: password})
			b.Refuse(tc.op, tc.cc)

			c, err := dial(t, b.Port, nil)
			require.NoError(t, err)

			err = calls[tc.op](t.Context(), c)

			var cce *ipmi.CompletionCodeError

			require.ErrorAs(t, err, &cce)
			require.Equal(t, uint8(tc.cc), cce.Code)
			require.Equal(t, tc.permanent, cce.Permanent())
			require.Equal(t, tc.permanent, permanent(err))
			require.Contains(t, err.Error(), fmt.Sprintf("completion code 0x%02x", uint8(tc.cc)))
			require.Contains(t, err.Error(), tc.words)
		})
	}
}

func TestDialFallsBackAndSaysWhich(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: user, Password: password, CipherSuites: []uint8{3}})

	c, err := dial(t, b.Port, nil)
	require.NoError(t, err)
	require.Equal(t, uint8(3), c.CipherSuite())
	require.Equal(t, 1, b.OpenSessions(fakebmc.AuthHMACSHA256), "17 asked once")
	require.Equal(t, 1, b.OpenSessions(fakebmc.AuthHMACSHA1), "then 3")

	_, err = dial(t, b.Port, func(cfg *ipmi.Config) { cfg.CipherSuites = []uint8{17} })
	require.ErrorContains(t, err, "cipher suite id (17)")
	require.True(t, permanent(err), "no common cipher suite is permanent: %v", err)

	var se *ipmi.SessionError

	require.ErrorAs(t, err, &se)
}

func TestWrongPassword(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: user, Password: password})

	for _, wrong := range []string{"x", "power", "wrong-password-xyz"} {
		_, err := dial(t, b.Port, func(cfg *ipmi.Config) { cfg.Password = wrong; cfg.CipherSuites = []uint8{3} })
		require.Error(t, err)
		require.True(t, permanent(err), "a wrong password is permanent: %v", err)
		require.False(t, strings.Contains(err.Error(), "[redacted]"), "nothing to redact in the library's text: %v", err)
	}
}

func TestCanceled(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: user, Password: password})
	c, err := dial(t, b.Port, nil)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	_, err = c.PowerStatus(ctx)
	require.Error(t, err)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, permanent(err))
}
