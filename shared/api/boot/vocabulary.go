package boot

import (
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// The journal's events carry the firmware class, iPXE's architecture and platform, a watched BMC's power state
// and a tunnel refusal's reason as enums; edges before those fields sent only their names, which every event
// still carries too. The methods below read the enum, or the name when the enum is unset (an older edge's
// journal), and map both to the machine's vocabulary; the New functions fill in both.

// firmwareClassNames are the ProxyDHCP's names for each class (its logs, the timeline, older journals).
var firmwareClassNames = map[FirmwareClass]string{
	FirmwareClass_FIRMWARE_CLASS_BIOS:       "bios",
	FirmwareClass_FIRMWARE_CLASS_UEFI_X86:   "uefi-x86",
	FirmwareClass_FIRMWARE_CLASS_UEFI_ARM64: "uefi-arm64",
	FirmwareClass_FIRMWARE_CLASS_HTTP_X86:   "http-x86",
	FirmwareClass_FIRMWARE_CLASS_HTTP_ARM64: "http-arm64",
}

var ipxeArchNames = map[IPXEArch]string{
	IPXEArch_IPXE_ARCH_I386:   "i386",
	IPXEArch_IPXE_ARCH_X86_64: "x86_64",
	IPXEArch_IPXE_ARCH_ARM64:  "arm64",
}

var ipxePlatformNames = map[IPXEPlatform]string{
	IPXEPlatform_IPXE_PLATFORM_PCBIOS: "pcbios",
	IPXEPlatform_IPXE_PLATFORM_EFI:    "efi",
}

// tunnelRefusalNames are the refusals' names (the edge's metric labels, older journals).
var tunnelRefusalNames = map[TunnelRefusal]string{
	TunnelRefusal_TUNNEL_REFUSAL_CONTESTED_MACHINE_ID:    "contested_machine_id",
	TunnelRefusal_TUNNEL_REFUSAL_SOURCE_NOT_BOOT_ADDRESS: "source_not_boot_address",
	TunnelRefusal_TUNNEL_REFUSAL_DUPLICATE_MACHINE_ID:    "duplicate_machine_id",
	TunnelRefusal_TUNNEL_REFUSAL_NO_BOOT_EVIDENCE:        "no_boot_evidence",
}

// byName returns the value named name in names (the zero value for none).
func byName[E comparable](names map[E]string, name string) E {
	for v, n := range names {
		if n == name {
			return v
		}
	}

	var zero E

	return zero
}

// FirmwareClassNamed is the class the ProxyDHCP calls name (unspecified for a name it does not use).
func FirmwareClassNamed(name string) FirmwareClass { return byName(firmwareClassNames, name) }

// IPXEArchNamed is the value of iPXE's ${buildarch} (unspecified for an architecture iPXE is not built for here).
func IPXEArchNamed(name string) IPXEArch { return byName(ipxeArchNames, name) }

// IPXEPlatformNamed is the value of iPXE's ${platform} (unspecified for another platform).
func IPXEPlatformNamed(name string) IPXEPlatform { return byName(ipxePlatformNames, name) }

// consoleResultNames are the console results' names (the edge's metric labels, older journals).
var consoleResultNames = map[ConsoleResult]string{
	ConsoleResult_CONSOLE_RESULT_OK:      "ok",
	ConsoleResult_CONSOLE_RESULT_REFUSED: "refused",
	ConsoleResult_CONSOLE_RESULT_FAILED:  "failed",
}

// ConsoleResultNamed is the result named name (unspecified for another name).
func ConsoleResultNamed(name string) ConsoleResult { return byName(consoleResultNames, name) }

// Name is the result's name (ok, refused, failed; "" when unspecified).
func (r ConsoleResult) Name() string { return consoleResultNames[r] }

// SetResult sets how the session ended: the enum and, for older controllers, its name.
func (c *ConsoleSession) SetResult(r ConsoleResult) *ConsoleSession {
	c.ConsoleResult, c.Result = r, r.Name()

	return c
}

// ReportedResult is how the session ended: the enum, or the one its name says in an older edge's event.
func (c *ConsoleSession) ReportedResult() ConsoleResult {
	if r := c.GetConsoleResult(); r != ConsoleResult_CONSOLE_RESULT_UNSPECIFIED {
		return r
	}

	return ConsoleResultNamed(c.GetResult())
}

// TunnelRefusalNamed is the refusal named name (unspecified for another name).
func TunnelRefusalNamed(name string) TunnelRefusal { return byName(tunnelRefusalNames, name) }

// Name is the refusal's name (contested_machine_id, source_not_boot_address, duplicate_machine_id,
// no_boot_evidence; "" when unspecified).
func (r TunnelRefusal) Name() string { return tunnelRefusalNames[r] }

// Name is the class's name (bios, uefi-x86, uefi-arm64, http-x86, http-arm64; "" when unspecified).
func (c FirmwareClass) Name() string { return firmwareClassNames[c] }

// Name is iPXE's name for the build (i386, x86_64, arm64; "" when unspecified).
func (a IPXEArch) Name() string { return ipxeArchNames[a] }

// Name is iPXE's name for the platform (pcbios, efi; "" when unspecified).
func (p IPXEPlatform) Name() string { return ipxePlatformNames[p] }

// Class is the client's firmware class: the enum, or the one its name says in an older edge's event.
func (d *DHCPSeen) Class() FirmwareClass {
	if c := d.GetFirmwareClass(); c != FirmwareClass_FIRMWARE_CLASS_UNSPECIFIED {
		return c
	}

	return FirmwareClassNamed(d.GetFirmware())
}

// MachineFirmware is the firmware the client boots with (BIOS for the BIOS class, UEFI for the others); false
// when the event tells none.
func (d *DHCPSeen) MachineFirmware() (metal.Firmware, bool) {
	switch d.Class() {
	case FirmwareClass_FIRMWARE_CLASS_BIOS:
		return metal.BIOS, true
	case FirmwareClass_FIRMWARE_CLASS_UNSPECIFIED:
		return "", false
	default:
		return metal.UEFI, true
	}
}

// ReportedArch is the build of the iPXE that asked: the enum, or the one its name says in an older edge's event.
func (b *BootServed) ReportedArch() IPXEArch {
	if a := b.GetIpxeArch(); a != IPXEArch_IPXE_ARCH_UNSPECIFIED {
		return a
	}

	return IPXEArchNamed(b.GetArch())
}

// ReportedPlatform is the platform iPXE ran on: the enum, or the one its name says in an older edge's event.
func (b *BootServed) ReportedPlatform() IPXEPlatform {
	if p := b.GetIpxePlatform(); p != IPXEPlatform_IPXE_PLATFORM_UNSPECIFIED {
		return p
	}

	return IPXEPlatformNamed(b.GetPlatform())
}

// MachineArch is the machine's architecture (BIOS iPXE's i386 build runs on x86-64 machines); false when the
// event tells none.
func (b *BootServed) MachineArch() (metal.Arch, bool) { return b.ReportedArch().MachineArch() }

// MachineFirmware is the machine's firmware (pcbios: BIOS, efi: UEFI); false when the event tells none.
func (b *BootServed) MachineFirmware() (metal.Firmware, bool) {
	return b.ReportedPlatform().MachineFirmware()
}

// MachineArch is the architecture of the machines the build runs on (i386 and x86_64: amd64, arm64: arm64);
// false when unspecified. It is the one mapping from what iPXE reports to the machine's architecture.
func (a IPXEArch) MachineArch() (metal.Arch, bool) {
	switch a {
	case IPXEArch_IPXE_ARCH_I386, IPXEArch_IPXE_ARCH_X86_64:
		return metal.AMD64, true
	case IPXEArch_IPXE_ARCH_ARM64:
		return metal.ARM64, true
	default:
		return "", false
	}
}

// MachineFirmware is the firmware of the machines the platform runs on (pcbios: BIOS, efi: UEFI); false when
// unspecified.
func (p IPXEPlatform) MachineFirmware() (metal.Firmware, bool) {
	switch p {
	case IPXEPlatform_IPXE_PLATFORM_PCBIOS:
		return metal.BIOS, true
	case IPXEPlatform_IPXE_PLATFORM_EFI:
		return metal.UEFI, true
	default:
		return "", false
	}
}

// NewTunnelRefused is the event of a tunnel refused for machineID from remoteIP: the enum and, for older
// controllers, its name.
func NewTunnelRefused(machineID string, r TunnelRefusal, remoteIP string) *TunnelRefused {
	return &TunnelRefused{MachineId: machineID, Refusal: r, Reason: r.Name(), RemoteIp: remoteIP}
}

// ReportedRefusal is why the tunnel was refused: the enum, or the one its name says in an older edge's event.
func (t *TunnelRefused) ReportedRefusal() TunnelRefusal {
	if r := t.GetRefusal(); r != TunnelRefusal_TUNNEL_REFUSAL_UNSPECIFIED {
		return r
	}

	return TunnelRefusalNamed(t.GetReason())
}

// NewPowerChanged is the event of machineID's new power state (errText: why the BMC did not answer): the enum
// and, for older controllers, its name.
func NewPowerChanged(machineID string, s bmcpb.PowerState, errText string) *PowerChanged {
	return &PowerChanged{MachineId: machineID, PowerState: s, State: s.Name(), Error: errText}
}

// ReportedState is the power state reported: the enum, or the one its name says in an older edge's event.
func (p *PowerChanged) ReportedState() bmcpb.PowerState {
	if s := p.GetPowerState(); s != bmcpb.PowerState_POWER_STATE_UNSPECIFIED {
		return s
	}

	return bmcpb.PowerStateNamed(p.GetState())
}
