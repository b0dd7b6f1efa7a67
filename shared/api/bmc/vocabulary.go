package bmc

import "github.com/outpost-metal/outpost/shared/metal"

// Power states travel as an enum; edges and controllers of v0.3.0 knew only their names, which every message
// still carries too. The methods below read the enum, or the name when the enum is unset (an older edge).

// powerStateNames are the states' names (the journal before the enum, the timeline, metric labels).
var powerStateNames = map[PowerState]string{
	PowerState_POWER_STATE_ON:      "on",
	PowerState_POWER_STATE_OFF:     "off",
	PowerState_POWER_STATE_UNKNOWN: "unknown",
}

// PowerStateNamed is the state named name: "on", "off" or "unknown" (unspecified for any other name).
func PowerStateNamed(name string) PowerState {
	for s, n := range powerStateNames {
		if n == name {
			return s
		}
	}

	return PowerState_POWER_STATE_UNSPECIFIED
}

// Name is the state's name ("on", "off", "unknown"; "" when unspecified).
func (s PowerState) Name() string { return powerStateNames[s] }

// ReportedState is the power state reported: the enum, or the one its name says from an older edge.
func (w *WatchedPower) ReportedState() PowerState {
	if s := w.GetPowerState(); s != PowerState_POWER_STATE_UNSPECIFIED {
		return s
	}

	return PowerStateNamed(w.GetState())
}

// NewWatchedPower is machineID's power state as the edge sends it: the enum and, for older controllers, its name.
func NewWatchedPower(machineID string, s PowerState) *WatchedPower {
	return &WatchedPower{MachineId: machineID, PowerState: s, State: s.Name()}
}

// BootModeOf is the boot mode of a one-time PXE boot of a machine with firmware f (unspecified for none).
func BootModeOf(f metal.Firmware) BootMode {
	switch f {
	case metal.BIOS:
		return BootMode_BOOT_MODE_BIOS
	case metal.UEFI:
		return BootMode_BOOT_MODE_UEFI
	default:
		return BootMode_BOOT_MODE_UNSPECIFIED
	}
}

// Firmware is the firmware class the mode boots; false when unspecified.
func (m BootMode) Firmware() (metal.Firmware, bool) {
	switch m {
	case BootMode_BOOT_MODE_BIOS:
		return metal.BIOS, true
	case BootMode_BOOT_MODE_UEFI:
		return metal.UEFI, true
	default:
		return "", false
	}
}
