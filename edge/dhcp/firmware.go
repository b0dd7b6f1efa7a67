// Package dhcp is the edge's ProxyDHCP service: it answers PXE clients on UDP 67 (DISCOVER -> OFFER)
// and 4011 (REQUEST -> ACK) with the boot file for their firmware, and never hands out addresses.
//
// The protocol decision is the pure function Decide (request in, reply or drop reason out);
// Server wraps it with sockets, a bounded worker pool, a per-MAC rate limit and metrics.
package dhcp

import (
	"github.com/insomniacslk/dhcp/iana"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Firmware is the class of boot firmware a client runs, derived from DHCP option 93
// (RFC 4578 client system architecture; codes from the IANA "Processor Architecture Types" registry).
type Firmware int

// Firmware classes the edge knows how to boot.
const (
	// FirmwareUnknown is an architecture code the edge has no boot file for.
	FirmwareUnknown Firmware = iota
	// FirmwareBIOS is legacy x86 PXE (code 0).
	FirmwareBIOS
	// FirmwareUEFIx86 is UEFI PXE on x86 (codes 6, 7 and 9; 7 and 9 are both seen for x86-64).
	FirmwareUEFIx86
	// FirmwareUEFIARM64 is UEFI PXE on arm64 (11) and U-Boot's EFI on arm64 (22).
	FirmwareUEFIARM64
	// FirmwareHTTPx86 is UEFI HTTP boot on x86 (15, 16).
	FirmwareHTTPx86
	// FirmwareHTTPARM64 is UEFI HTTP boot on arm64 (19) and U-Boot HTTP on arm64 (24).
	FirmwareHTTPARM64
)

// AllFirmware lists the bootable firmware classes in a stable order.
var AllFirmware = []Firmware{FirmwareBIOS, FirmwareUEFIx86, FirmwareUEFIARM64, FirmwareHTTPx86, FirmwareHTTPARM64}

// Class is the firmware class as the journal carries it (unspecified for FirmwareUnknown).
func (f Firmware) Class() bootpb.FirmwareClass {
	switch f {
	case FirmwareBIOS:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_BIOS
	case FirmwareUEFIx86:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_UEFI_X86
	case FirmwareUEFIARM64:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_UEFI_ARM64
	case FirmwareHTTPx86:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_HTTP_X86
	case FirmwareHTTPARM64:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_HTTP_ARM64
	default:
		return bootpb.FirmwareClass_FIRMWARE_CLASS_UNSPECIFIED
	}
}

// String returns the class name used in logs, metrics and events (the journal's name for it).
func (f Firmware) String() string {
	if name := f.Class().Name(); name != "" {
		return name
	}

	return "unknown"
}

// HTTPBoot reports whether the class boots from an http:// URL instead of a TFTP file.
func (f Firmware) HTTPBoot() bool {
	return f == FirmwareHTTPx86 || f == FirmwareHTTPARM64
}

// UEFI reports whether the class is UEFI firmware (PXE or HTTP boot, any architecture).
func (f Firmware) UEFI() bool {
	return f != FirmwareUnknown && f != FirmwareBIOS
}

// Arch returns the architecture of the machines the class boots (BIOS and x86 UEFI: amd64; "" for
// FirmwareUnknown).
func (f Firmware) Arch() metal.Arch {
	switch f {
	case FirmwareBIOS, FirmwareUEFIx86, FirmwareHTTPx86:
		return metal.AMD64
	case FirmwareUEFIARM64, FirmwareHTTPARM64:
		return metal.ARM64
	default:
		return ""
	}
}

// FirmwareFromArch maps an option 93 architecture code to a firmware class (RFC 4578 §2.1, IANA registry).
func FirmwareFromArch(code iana.Arch) Firmware {
	switch code {
	case iana.INTEL_X86PC:
		return FirmwareBIOS
	case iana.EFI_IA32, iana.EFI_X86_64, iana.EFI_BC:
		return FirmwareUEFIx86
	case iana.EFI_ARM64, iana.UBOOT_ARM64:
		return FirmwareUEFIARM64
	case iana.EFI_X86_HTTP, iana.EFI_X86_64_HTTP:
		return FirmwareHTTPx86
	case iana.EFI_ARM64_HTTP, iana.UBOOT_ARM64_HTTP:
		return FirmwareHTTPARM64
	default:
		return FirmwareUnknown
	}
}
