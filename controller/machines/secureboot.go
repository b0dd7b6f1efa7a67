package machines

import (
	"errors"
	"fmt"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrBadSecureBoot means a Secure Boot setting other than on, off or auto.
var ErrBadSecureBoot = errors.New(`secure boot must be "on", "off" or "auto"`)

// ParseSecureBoot parses an operator's Secure Boot setting: on or off, or auto (and ""), which is unspecified
// (what the machine's BMC says decides).
func ParseSecureBoot(s string) (bootpb.SecureBoot, error) {
	switch s {
	case "on":
		return bootpb.SecureBoot_SECURE_BOOT_ON, nil
	case "off":
		return bootpb.SecureBoot_SECURE_BOOT_OFF, nil
	case "auto", "":
		return bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, nil
	default:
		return 0, fmt.Errorf("%w: %q", ErrBadSecureBoot, s)
	}
}

// SecureBootName is the operator's word for a Secure Boot setting: on, off, or auto for unspecified.
func SecureBootName(s bootpb.SecureBoot) string {
	switch s {
	case bootpb.SecureBoot_SECURE_BOOT_ON:
		return "on"
	case bootpb.SecureBoot_SECURE_BOOT_OFF:
		return "off"
	default:
		return "auto"
	}
}

// SetSecureBoot records what machineID's BMC said of its firmware's Secure Boot (unspecified: the BMC does not
// say, which forgets an earlier answer). A machine never seen at a site is ignored: its location, when it
// comes, is read from the BMC again.
func (l *Locations) SetSecureBoot(machineID metal.ID, s bootpb.SecureBoot) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if cur, ok := l.machines[machineID]; ok && cur.SecureBoot != s {
		cur.SecureBoot = s
		l.markLocked(machineID)
	}
}

// OverrideSecureBoot sets an operator's word on whether machineID's firmware enforces Secure Boot, above its
// site's setting and its BMC's answer, or with unspecified (the operator's "auto") hands it back to them. It
// returns the machine's location as it is now (Location.EnforcesSecureBoot with its site's setting tells what
// its plans say).
func (l *Locations) OverrideSecureBoot(machineID metal.ID, s bootpb.SecureBoot) (Location, error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return Location{}, fmt.Errorf("%s: %w", machineID, ErrNotLocated)
	}

	if cur.SecureBootOverride != s {
		cur.SecureBootOverride = s
		l.markLocked(machineID)
	}

	return *cur, nil
}
