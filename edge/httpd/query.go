package httpd

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// maxQueryLen bounds the raw query of boot.ipxe; iPXE sends well under 200 bytes.
const maxQueryLen = 512

// ErrBadQuery is returned for a boot.ipxe query that cannot come from our own init.ipxe.
var ErrBadQuery = errors.New("bad boot query")

// BootQuery is what init.ipxe sends to boot.ipxe.
type BootQuery struct {
	// UUID is iPXE's ${uuid} (SMBIOS UUID), parsed; empty when the machine has none.
	UUID metal.ID
	// MAC is the booting interface's address; nil when absent.
	MAC net.HardwareAddr
	// Build is iPXE's ${buildarch}: i386 (the BIOS build), x86_64 or arm64; x86_64 when not sent.
	Build bootpb.IPXEArch
	// Platform is iPXE's ${platform}: pcbios or efi, the firmware the machine booted with; unspecified when
	// not sent.
	Platform bootpb.IPXEPlatform
}

// ParseBootQuery validates a raw boot.ipxe query string. Each parameter may appear at most once.
func ParseBootQuery(raw string) (BootQuery, error) {
	var q BootQuery

	if len(raw) > maxQueryLen {
		return q, fmt.Errorf("query of %d bytes: %w", len(raw), ErrBadQuery)
	}

	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, fmt.Errorf("parse query: %w: %w", err, ErrBadQuery)
	}

	for k, v := range vals {
		if len(v) > 1 {
			return q, fmt.Errorf("parameter %q given %d times: %w", k, len(v), ErrBadQuery)
		}
	}

	if u := vals.Get("uuid"); u != "" {
		id, err := metal.ParseID(u)
		if err != nil {
			return q, fmt.Errorf("uuid %q: %w", truncate(u), ErrBadQuery)
		}

		q.UUID = id
	}

	if m := vals.Get("mac"); m != "" {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 {
			return q, fmt.Errorf("mac %q: %w", truncate(m), ErrBadQuery)
		}

		q.MAC = hw
	}

	q.Build = bootpb.IPXEArch_IPXE_ARCH_X86_64
	if a := vals.Get("arch"); a != "" {
		if q.Build = bootpb.IPXEArchNamed(a); q.Build == bootpb.IPXEArch_IPXE_ARCH_UNSPECIFIED {
			return q, fmt.Errorf("arch %q: %w", truncate(a), ErrBadQuery)
		}
	}

	if p := vals.Get("platform"); p != "" {
		if q.Platform = bootpb.IPXEPlatformNamed(p); q.Platform == bootpb.IPXEPlatform_IPXE_PLATFORM_UNSPECIFIED {
			return q, fmt.Errorf("platform %q: %w", truncate(p), ErrBadQuery)
		}
	}

	return q, nil
}

// Arch is the architecture of the machine the build runs on, the one its kernel is built for: a BIOS machine
// runs the i386 build of iPXE (undionly.kpxe) but boots an amd64 kernel. A query without a build is amd64, as
// ParseBootQuery reads one without arch.
func (q BootQuery) Arch() metal.Arch {
	if a, ok := q.Build.MachineArch(); ok {
		return a
	}

	return metal.AMD64
}

// Encode returns the query in the form ParseBootQuery reads (the MAC hyphenated, as init.ipxe sends it).
func (q BootQuery) Encode() string {
	v := url.Values{"arch": {cmp.Or(q.Build.Name(), bootpb.IPXEArch_IPXE_ARCH_X86_64.Name())}}

	if q.UUID != "" {
		v.Set("uuid", q.UUID.String())
	}

	if q.MAC != nil {
		v.Set("mac", strings.ReplaceAll(q.MAC.String(), ":", "-"))
	}

	if q.Platform != bootpb.IPXEPlatform_IPXE_PLATFORM_UNSPECIFIED {
		v.Set("platform", q.Platform.Name())
	}

	return v.Encode()
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}

	return s
}
