// Package status is what an operator sees of the fleet: a status page on the controller's HTTP listener
// (sites with their link state and machines by phase, a page per machine with its timeline, live updates over
// server-sent events) and the Machines admin API the `controller machine` commands use. It reads through
// small interfaces: the site view the app builds from the site registry, and the machines' timelines
// (package timeline).
package status

import (
	"context"
	"time"

	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Site is what the status page shows of a site.
type Site struct {
	ID          string
	Description string
	// State is connected, offline, revoked or awaiting-enrolment.
	State       string
	LastSeen    time.Time
	EdgeVersion string
	// Boots says how the site's machines boot, from its DHCP setting (BootsBy).
	Boots string
	// AssetsKnown says whether AssetsCached and AssetsMissing are known.
	AssetsKnown   bool
	AssetsCached  int
	AssetsMissing int
}

// Sites lists the sites (the site registry with each link's state).
type Sites interface {
	Sites(ctx context.Context) ([]Site, error)
}

// Machines is the machines' timelines (*timeline.Book).
type Machines interface {
	List(f timeline.Filter, offset, limit int) ([]timeline.Machine, int)
	Get(machineID metal.ID) (timeline.Record, bool)
	// GetByMAC is the machine a network interface belongs to, or what its edge reported of a MAC no boot
	// script has tied to a machine yet.
	GetByMAC(mac string) (timeline.Record, bool)
	Phases() map[string]map[string]int
	Changed() <-chan struct{}
}

// BootsBy says how a site's machines boot under its DHCP mode (proxy, full or off; "" the edge's own, proxy).
func BootsBy(dhcpMode string) string {
	switch dhcpMode {
	case "full":
		return "network boot, addresses leased by the edge"
	case "off":
		return "virtual media through their BMCs, static addresses"
	default:
		return "network boot beside the site's DHCP server (ProxyDHCP)"
	}
}
