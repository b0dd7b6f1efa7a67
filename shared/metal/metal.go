// Package metal is the vocabulary both binaries use for one machine: its ID (the SMBIOS UUID its firmware
// reports), the gRPC metadata key that names it on agent calls, its architecture and its firmware class, each
// with the one mapping from the names the boot chain reports (iPXE's ${buildarch} and ${platform}).
package metal

import (
	"errors"
	"fmt"
	"strings"
)

// MetadataKey names the machine on an agent's reverse tunnel and on the calls proxied to it (the
// talos-metal-agent's constants.MachineIDMetadataKey).
const MetadataKey = "machine-id"

// ErrMalformedID is returned for a machine ID that is not an SMBIOS UUID.
var ErrMalformedID = errors.New("malformed machine-id")

// ID is a machine's ID in the form every table and record keys machines by: its SMBIOS UUID in lower case
// (ParseID, or ParsePeerID for what a peer wrote).
type ID string

// String is the ID as written on the wire.
func (id ID) String() string { return string(id) }

// ParseID checks that id is an SMBIOS UUID (8-4-4-4-12 hex digits) and returns it in lower case, the form
// every table and record keys machines by.
func ParseID(id string) (ID, error) {
	const uuidLen = 36

	if len(id) != uuidLen {
		return "", fmt.Errorf("%w: length %d, want a UUID", ErrMalformedID, len(id))
	}

	for i := range len(id) {
		c := id[i]

		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", fmt.Errorf("%w: want a UUID", ErrMalformedID)
			}
		default:
			if !isHex(c) {
				return "", fmt.Errorf("%w: want a UUID", ErrMalformedID)
			}
		}
	}

	return ID(strings.ToLower(id)), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// ParsePeerID is ParseID for an ID as a peer may write it (surrounding spaces or braces, upper case): the
// lenient form (NormalizeID), checked.
func ParsePeerID(id string) (ID, error) {
	return ParseID(NormalizeID(id))
}

// NormalizeID is the lenient form of an ID as peers write it (braces, spaces, upper case): trimmed and lower
// case, not checked. Use ParseID where a malformed ID must be refused.
func NormalizeID(id string) string {
	return strings.ToLower(strings.Trim(strings.TrimSpace(id), "{}"))
}

// Arch is a machine's CPU architecture, named as Talos and the asset catalog name it.
type Arch string

// Architectures.
const (
	AMD64 Arch = "amd64"
	ARM64 Arch = "arm64"
)

// ErrUnknownArch is returned for an architecture name that is neither amd64 nor arm64.
var ErrUnknownArch = errors.New("unknown architecture")

// ParseArch parses an architecture as Talos, the asset catalog and operators name it (amd64, arm64).
func ParseArch(s string) (Arch, error) {
	switch a := Arch(s); a {
	case AMD64, ARM64:
		return a, nil
	default:
		return "", fmt.Errorf("%w %q: want amd64 or arm64", ErrUnknownArch, s)
	}
}

// String is the architecture's name.
func (a Arch) String() string { return string(a) }

// IPXE is iPXE's name for the architecture's 64-bit build (x86_64, arm64), under which the boot table keys
// its agent-mode kernels.
func (a Arch) IPXE() string {
	if a == ARM64 {
		return "arm64"
	}

	return "x86_64"
}

// Firmware is the firmware class a machine boots with, as a one-time PXE boot through its BMC must ask.
type Firmware string

// Firmware classes.
const (
	BIOS Firmware = "bios"
	UEFI Firmware = "uefi"
)

// ErrUnknownFirmware is returned for a firmware class name that is neither bios nor uefi.
var ErrUnknownFirmware = errors.New("unknown firmware")

// ParseFirmware parses a firmware class as operators and the BMC boot override name it (bios, uefi; any
// case).
func ParseFirmware(s string) (Firmware, error) {
	switch f := Firmware(strings.ToLower(s)); f {
	case BIOS, UEFI:
		return f, nil
	default:
		return "", fmt.Errorf("%w %q: want bios or uefi", ErrUnknownFirmware, s)
	}
}

// String is the class's name.
func (f Firmware) String() string { return string(f) }
