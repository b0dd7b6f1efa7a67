package httpd

import (
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
	// UUID is iPXE's ${uuid} (SMBIOS UUID), lower case; empty when the machine has none.
	UUID string
	// MAC is the booting interface's address; nil when absent.
	MAC net.HardwareAddr
	// Arch is iPXE's ${buildarch}: i386, x86_64 or arm64.
	Arch string
	// Platform is iPXE's ${platform}: pcbios or efi, the firmware the machine booted with; empty when not sent.
	Platform string
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

	q.Arch = vals.Get("arch")
	if q.Arch == "" {
		q.Arch = "x86_64"
	}

	if bootpb.IPXEArchNamed(q.Arch) == bootpb.IPXEArch_IPXE_ARCH_UNSPECIFIED {
		return q, fmt.Errorf("arch %q: %w", truncate(q.Arch), ErrBadQuery)
	}

	if q.Platform = vals.Get("platform"); q.Platform != "" && bootpb.IPXEPlatformNamed(q.Platform) == bootpb.IPXEPlatform_IPXE_PLATFORM_UNSPECIFIED {
		return q, fmt.Errorf("platform %q: %w", truncate(q.Platform), ErrBadQuery)
	}

	return q, nil
}

// KernelArch maps iPXE's build arch to the machine's kernel arch: a BIOS machine runs the i386 build of
// iPXE (undionly.kpxe) but boots an x86_64 kernel.
func (q BootQuery) KernelArch() string {
	if q.Arch == "i386" {
		return "x86_64"
	}

	return q.Arch
}

// Encode returns the query in the form ParseBootQuery reads (the MAC hyphenated, as init.ipxe sends it).
func (q BootQuery) Encode() string {
	v := url.Values{"arch": {q.Arch}}

	if q.UUID != "" {
		v.Set("uuid", q.UUID)
	}

	if q.MAC != nil {
		v.Set("mac", strings.ReplaceAll(q.MAC.String(), ":", "-"))
	}

	if q.Platform != "" {
		v.Set("platform", q.Platform)
	}

	return v.Encode()
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}

	return s
}
