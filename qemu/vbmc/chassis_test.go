package vbmc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/vbmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

type hookCall struct {
	action vbmc.Action
	boot   vbmc.Override
}

func TestChassisHook(t *testing.T) {
	t.Parallel()

	var (
		calls []hookCall
		fail  error
	)

	ch := vbmc.NewChassis(vbmc.WithHook(func(_ context.Context, a vbmc.Action, b vbmc.Override) error {
		calls = append(calls, hookCall{a, b})

		return fail
	}))

	ctx := t.Context()

	// A failing hook (QEMU did not start) leaves the machine off and the override in place.
	ch.SetOverride(vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI})
	fail = errors.New("qemu did not start")
	require.Error(t, ch.SetPower(ctx, true))
	require.False(t, ch.PowerState())
	require.Equal(t, vbmc.BootPXE, ch.Override().Device)

	fail = nil
	require.NoError(t, ch.SetPower(ctx, true))
	require.NoError(t, ch.SetPower(ctx, true)) // already on: no second start
	require.NoError(t, ch.Reset(ctx))
	require.NoError(t, ch.SetPower(ctx, false))

	require.Equal(t, []hookCall{
		{vbmc.ActionPowerOn, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI}},
		{vbmc.ActionPowerOn, vbmc.Override{Device: vbmc.BootPXE, Mode: metal.UEFI}},
		{vbmc.ActionReset, vbmc.Override{}}, // the one-time override was consumed
		{vbmc.ActionPowerOff, vbmc.Override{}},
	}, calls)

	// A persistent override survives boots.
	ch.SetOverride(vbmc.Override{Device: vbmc.BootDisk, Persistent: true})
	require.NoError(t, ch.Reset(ctx))
	require.NoError(t, ch.Reset(ctx))
	require.Equal(t, vbmc.BootDisk, ch.Override().Device)
}
