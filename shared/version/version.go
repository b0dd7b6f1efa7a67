// Package version reports which build of Outpost is running.
//
// The release build stamps the version with
// -ldflags "-X github.com/outpost-metal/outpost/shared/version.stamped=v1.2.3";
// otherwise the module's build information (VCS revision) is used.
package version

import (
	"runtime/debug"
	"strings"
)

// stamped is set by the linker; it is never written at run time.
var stamped string

// ProtocolVersion is the uplink protocol version this build speaks.
// Bump it only for incompatible changes of the hello or the uplink services.
const ProtocolVersion = 1

// String returns the version of this build, "dev" when nothing is known.
func String() string {
	if stamped != "" {
		return stamped
	}

	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}

	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}

	var rev, dirty string

	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}

	if rev == "" {
		return "dev"
	}

	return "dev-" + strings.TrimSpace(rev[:min(12, len(rev))]) + dirty
}
