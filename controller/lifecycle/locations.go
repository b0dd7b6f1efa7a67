package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// ErrBadMachineID means an edge event named a machine ID that is not an SMBIOS UUID.
var ErrBadMachineID = errors.New("machine id is not a uuid")

// Locations is an in-memory SiteLocator fed from edge events: where each machine was last seen and whether
// its agent tunnel is open there. A machine that shows up at a second site moves there, with a warning.
// It is safe for concurrent use.
type Locations struct {
	logger   *zap.Logger
	rejected *prometheus.CounterVec

	mu       sync.Mutex
	machines map[string]*Location
	// firmwareByMAC is the firmware each MAC's DHCP requests announced; a machine's first boot script ties its
	// UUID to its MAC. (DHCP's own UUID, option 97, is in the client's byte order and cannot be trusted.)
	firmwareByMAC map[string]string
}

// maxTrackedMACs bounds firmwareByMAC; a flood of made-up MACs resets it.
const maxTrackedMACs = 65536

// NewLocations returns an empty locator.
func NewLocations(logger *zap.Logger) *Locations {
	return &Locations{
		logger:        logger.With(zap.String("component", "machine_locations")),
		machines:      map[string]*Location{},
		firmwareByMAC: map[string]string{},
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "lifecycle", Name: "edge_events_rejected_total",
			Help: "Edge events about machines that were not used, by reason.",
		}, []string{"reason"}),
	}
}

// checkID accepts the canonical SMBIOS UUID form (8-4-4-4-12 hex digits), as iPXE's ${uuid} and the agent send it.
func checkID(machineID string) error {
	if len(machineID) != 36 {
		return fmt.Errorf("%w: %q", ErrBadMachineID, machineID)
	}

	for i, c := range machineID {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return fmt.Errorf("%w: %q", ErrBadMachineID, machineID)
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return fmt.Errorf("%w: %q", ErrBadMachineID, machineID)
		}
	}

	return nil
}

// Seen records that siteID's edge saw machineID (PXE or DHCP request, agent tunnel). It reports whether the
// machine moved from another site.
func (l *Locations) Seen(siteID, machineID string) (moved bool, err error) {
	if err = checkID(machineID); err != nil {
		return false, err
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if ok && cur.SiteID == siteID {
		return false, nil
	}

	if ok {
		l.logger.Warn("machine moved to another site", zap.String("machine", machineID),
			zap.String("from_site", cur.SiteID), zap.String("to_site", siteID))
	}

	next := &Location{SiteID: siteID}
	if ok {
		next.Arch, next.Firmware = cur.Arch, cur.Firmware
	}

	l.machines[machineID] = next

	return ok, nil
}

// AgentConnected records an agent tunnel opening or closing at siteID. An open tunnel also means the machine
// is at that site; a close reported by a site the machine has left is stale and ignored.
func (l *Locations) AgentConnected(siteID, machineID string, connected bool) error {
	if connected {
		if _, err := l.Seen(siteID, machineID); err != nil {
			return err
		}
	} else if err := checkID(machineID); err != nil {
		return err
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok || cur.SiteID != siteID {
		return nil
	}

	cur.AgentConnected = connected

	return nil
}

// SetArch records the architecture a machine's network boot reported (iPXE ${buildarch}: x86_64, arm64).
func (l *Locations) SetArch(machineID, arch string) {
	switch arch {
	case "x86_64", "i386", "amd64":
		arch = "amd64"
	case "arm64", "aarch64":
		arch = "arm64"
	default:
		return
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if cur, ok := l.machines[machineID]; ok {
		cur.Arch = arch
	}
}

// SetFirmware records the firmware a machine's PXE request reported ("bios" or "uefi"; others are ignored).
func (l *Locations) SetFirmware(machineID, firmware string) {
	if firmware != "bios" && firmware != "uefi" {
		return
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if cur, ok := l.machines[machineID]; ok {
		cur.Firmware = firmware
	}
}

// SetFirmwareByMAC records the firmware a MAC's DHCP request announced.
func (l *Locations) SetFirmwareByMAC(mac, firmware string) {
	if mac == "" || (firmware != "bios" && firmware != "uefi") {
		return
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if len(l.firmwareByMAC) >= maxTrackedMACs {
		l.firmwareByMAC = map[string]string{}
	}

	l.firmwareByMAC[strings.ToLower(mac)] = firmware
}

// firmwareOfMAC returns what SetFirmwareByMAC recorded.
func (l *Locations) firmwareOfMAC(mac string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	fw, ok := l.firmwareByMAC[strings.ToLower(mac)]

	return fw, ok
}

// SiteOffline forgets the agent tunnels of a site whose session ended (they ended with it); locations stay.
func (l *Locations) SiteOffline(siteID string) {
	l.mu.Lock()
	defer l.mu.Unlock()

	for _, loc := range l.machines {
		if loc.SiteID == siteID {
			loc.AgentConnected = false
		}
	}
}

// Locate implements SiteLocator.
func (l *Locations) Locate(machineID string) (Location, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return Location{}, false
	}

	return *cur, true
}

// SiteOf returns the site machineID was last seen at (the machineaccess.Locator shape).
func (l *Locations) SiteOf(machineID string) (string, bool) {
	loc, ok := l.Locate(machineID)

	return loc.SiteID, ok
}
