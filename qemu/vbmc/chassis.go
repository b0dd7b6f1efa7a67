// Package vbmc provides virtual BMCs for tests and the lab: a Chassis (power state, one-time boot
// device and mode, a hook that acts on a VM) with two front ends, IPMI v2 over LAN (go-ipmi's
// server packages) and a small Redfish emulator.
package vbmc

import (
	"context"
	"sync"
	"time"

	"github.com/outpost-metal/outpost/shared/metal"
)

// BootDevice is a boot override target.
type BootDevice string

// Boot override targets.
const (
	BootNone BootDevice = ""
	BootPXE  BootDevice = "pxe"
	BootDisk BootDevice = "disk"
)

// Override is the boot override of a chassis; Mode is the firmware mode it boots in.
type Override struct {
	Device     BootDevice
	Mode       metal.Firmware
	Persistent bool
}

// Action is what the chassis asks its hook to do.
type Action string

// Actions passed to a Hook.
const (
	ActionPowerOn  Action = "power-on"
	ActionPowerOff Action = "power-off"
	ActionReset    Action = "reset"
)

// Hook acts on the machine behind the chassis (start, stop or reset a QEMU process). boot is the
// override this power-on or reset boots with (Device empty: the firmware's own order).
type Hook func(ctx context.Context, action Action, boot Override) error

// Chassis is the state a BMC manages. It is safe for concurrent use.
type Chassis struct {
	hook    Hook
	latency time.Duration

	mu       sync.Mutex
	on       bool
	override Override
	boots    []Override

	inflight, maxInflight int
}

// ChassisOption configures a Chassis.
type ChassisOption func(*Chassis)

// WithHook sets the hook that acts on the machine.
func WithHook(h Hook) ChassisOption { return func(c *Chassis) { c.hook = h } }

// WithLatency makes every chassis operation take at least d (to observe concurrency in tests).
func WithLatency(d time.Duration) ChassisOption { return func(c *Chassis) { c.latency = d } }

// NewChassis returns a powered-off chassis without boot override.
func NewChassis(opts ...ChassisOption) *Chassis {
	c := &Chassis{override: Override{Mode: metal.BIOS}}
	for _, o := range opts {
		o(c)
	}

	return c
}

// enter marks an operation in flight; the returned func ends it.
func (c *Chassis) enter() func() {
	c.mu.Lock()
	c.inflight++
	c.maxInflight = max(c.maxInflight, c.inflight)
	c.mu.Unlock()

	if c.latency > 0 {
		time.Sleep(c.latency)
	}

	return func() {
		c.mu.Lock()
		c.inflight--
		c.mu.Unlock()
	}
}

// MaxConcurrent returns the largest number of operations that were ever in flight at once.
func (c *Chassis) MaxConcurrent() int {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.maxInflight
}

// PowerState reports whether the machine is on.
func (c *Chassis) PowerState() bool {
	defer c.enter()()

	c.mu.Lock()
	defer c.mu.Unlock()

	return c.on
}

// SetPower turns the machine on or off (no-op when already so).
func (c *Chassis) SetPower(ctx context.Context, on bool) error {
	defer c.enter()()

	c.mu.Lock()
	defer c.mu.Unlock()

	if c.on == on {
		return nil
	}

	if on {
		return c.boot(ctx, ActionPowerOn)
	}

	if err := c.callHook(ctx, ActionPowerOff, Override{}); err != nil {
		return err
	}

	c.on = false

	return nil
}

// Reset restarts the machine (powers it on when off), consuming a one-time override.
func (c *Chassis) Reset(ctx context.Context) error {
	defer c.enter()()

	c.mu.Lock()
	defer c.mu.Unlock()

	action := ActionReset
	if !c.on {
		action = ActionPowerOn
	}

	return c.boot(ctx, action)
}

// boot runs a power-on or reset with the current override and clears a one-time one. c.mu is held.
func (c *Chassis) boot(ctx context.Context, action Action) error {
	used := c.override
	if used.Device == BootNone {
		used = Override{}
	}

	if err := c.callHook(ctx, action, used); err != nil {
		return err
	}

	c.on = true
	c.boots = append(c.boots, used)

	if !c.override.Persistent {
		c.override.Device = BootNone
	}

	return nil
}

func (c *Chassis) callHook(ctx context.Context, action Action, boot Override) error {
	if c.hook == nil {
		return nil
	}

	return c.hook(ctx, action, boot)
}

// Override returns the current boot override.
func (c *Chassis) Override() Override {
	defer c.enter()()

	c.mu.Lock()
	defer c.mu.Unlock()

	return c.override
}

// SetOverride sets the boot override.
func (c *Chassis) SetOverride(o Override) {
	defer c.enter()()

	c.mu.Lock()
	defer c.mu.Unlock()

	if o.Mode == "" {
		o.Mode = c.override.Mode
	}

	c.override = o
}

// Boots returns the overrides each power-on or reset booted with, oldest first.
func (c *Chassis) Boots() []Override {
	c.mu.Lock()
	defer c.mu.Unlock()

	return append([]Override(nil), c.boots...)
}
