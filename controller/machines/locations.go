package machines

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrBadMachineID means an edge event named a machine ID that is not an SMBIOS UUID (the vocabulary's error).
var ErrBadMachineID = metal.ErrMalformedID

// Locations is the SiteLocator fed from edge events: where each machine was last seen, how it boots and
// whether its agent tunnel is open there. It is kept in memory for the lifecycle's reads and made durable in
// Omni (MachineLocation records, see Load and Persist), so a restarted controller knows every machine's site
// before any edge speaks again. A machine moves to another site only on boot evidence there (its boot script
// served); an agent tunnel claiming a machine located elsewhere is refused and counted. It is safe for
// concurrent use.
type Locations struct {
	logger   *zap.Logger
	rejected *prometheus.CounterVec
	alerts   *prometheus.CounterVec
	now      func() time.Time

	mu       sync.Mutex
	machines map[metal.ID]*Location
	// firmwareByMAC is the firmware each MAC's DHCP requests announced; a machine's first boot script ties its
	// UUID to its MAC. (DHCP's own UUID, option 97, is in the client's byte order and cannot be trusted.)
	firmwareByMAC map[string]string
	// dirty are the machines whose record must be written to Omni; changed wakes Persist.
	dirty   map[metal.ID]bool
	changed chan struct{}
	// writing are the machines of the pass Persist is writing now; passed is closed (and replaced) at the
	// end of each pass. persisting says Persist runs. WaitWritten waits on them.
	writing    map[metal.ID]bool
	passed     chan struct{}
	persisting bool
	// loaded is closed once Load has merged the records kept in Omni.
	loaded     chan struct{}
	loadedOnce sync.Once
	// onChange are told, with l.mu held, of every machine whose location changed (OnChange).
	onChange []func(machineID metal.ID)
}

// maxTrackedMACs bounds firmwareByMAC; a flood of made-up MACs resets it.
const maxTrackedMACs = 65536

// maxMACsPerMachine bounds the MACs kept per machine.
const maxMACsPerMachine = 8

// NewLocations returns an empty locator.
func NewLocations(logger *zap.Logger) *Locations {
	return &Locations{
		logger:        logger.With(zap.String("component", "machine_locations")),
		machines:      map[metal.ID]*Location{},
		firmwareByMAC: map[string]string{},
		dirty:         map[metal.ID]bool{},
		changed:       make(chan struct{}, 1),
		writing:       map[metal.ID]bool{},
		passed:        make(chan struct{}),
		loaded:        make(chan struct{}),
		now:           time.Now,
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "lifecycle", Name: "edge_events_rejected_total",
			Help: "Edge events about machines that were not used, by reason.",
		}, []string{"reason"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "lifecycle", Name: "machine_alerts_total",
			Help: "Alerts raised on machines whose identity was contested (another host or a clone asked for its agent tunnel, another site claimed it), by alert.",
		}, []string{"alert"}),
	}
}

// OnChange has fn told of every machine whose location, agent tunnel, boot details or watched power state
// changed, so the lifecycle observes it again at once instead of at its next poll. fn is called with the
// locations locked: it must not block or call back.
func (l *Locations) OnChange(fn func(machineID metal.ID)) {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.onChange = append(l.onChange, fn)
}

func (l *Locations) changedLocked(machineID metal.ID) {
	for _, fn := range l.onChange {
		fn(machineID)
	}
}

// markLocked records that machineID's record must be written; l.mu is held.
func (l *Locations) markLocked(machineID metal.ID) {
	l.dirty[machineID] = true
	l.changedLocked(machineID)

	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// checkID accepts the canonical SMBIOS UUID form (8-4-4-4-12 hex digits, lower case), as metal.ParseID
// returns it; an ID converted from anything else is refused.
func checkID(machineID metal.ID) error {
	if id, err := metal.ParseID(machineID.String()); err != nil || id != machineID {
		return fmt.Errorf("%w: %q", ErrBadMachineID, machineID)
	}

	return nil
}

// Seen records that siteID's edge served machineID its boot script: boot evidence, which places the machine
// at that site (moving it from another site, with a warning). It reports whether the machine moved.
func (l *Locations) Seen(siteID string, machineID metal.ID) (moved bool, err error) {
	if err = checkID(machineID); err != nil {
		return false, err
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if ok && cur.SiteID == siteID {
		cur.LastSeen = l.now()
		l.markLocked(machineID)

		return false, nil
	}

	if ok {
		l.logger.Warn("machine moved to another site on boot evidence", zap.Stringer("machine", machineID),
			zap.String("from_site", cur.SiteID), zap.String("to_site", siteID))
	}

	next := &Location{SiteID: siteID, LastSeen: l.now()}
	if ok {
		next.Arch, next.Firmware, next.FirmwareSource = cur.Arch, cur.Firmware, cur.FirmwareSource
	}

	l.machines[machineID] = next
	l.markLocked(machineID)

	return ok, nil
}

// ErrClaimRefused means an edge claimed a machine the controller knows at another site without boot evidence.
var ErrClaimRefused = errors.New("machine is located at another site")

// AgentConnected records an agent tunnel opening or closing at siteID. An open tunnel places a machine not
// located anywhere yet at that site; a tunnel at a site other than the machine's is a claim, refused
// (ErrClaimRefused), and a close reported by a site the machine has left is stale and ignored.
func (l *Locations) AgentConnected(siteID string, machineID metal.ID, connected bool) error {
	if err := checkID(machineID); err != nil {
		return err
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]

	switch {
	case !ok && connected:
		cur = &Location{SiteID: siteID}
		l.machines[machineID] = cur
	case !ok:
		return nil
	case cur.SiteID != siteID && connected:
		return fmt.Errorf("%w: tunnel for %s at site %s, machine at site %s", ErrClaimRefused, machineID, siteID, cur.SiteID)
	case cur.SiteID != siteID:
		return nil
	}

	if connected {
		cur.LastSeen = l.now()

		if cur.Alert != "" && cur.Alert != AlertTunnelContested {
			l.logger.Info("machine alert cleared: its own agent tunnel is open", zap.Stringer("machine", machineID),
				zap.String("alert", cur.Alert))
			cur.Alert, cur.AlertAt = "", time.Time{}
		}
	}

	if cur.AgentConnected != connected || connected {
		cur.AgentConnected = connected
		l.markLocked(machineID)
	}

	return nil
}

// ClearAlert clears a machine's alert, as an operator does once a cloned UUID is fixed (a contested UUID is
// never cleared otherwise). It returns the alert that was set ("" when none was).
func (l *Locations) ClearAlert(machineID metal.ID) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return "", fmt.Errorf("%s: %w", machineID, ErrNotLocated)
	}

	was := cur.Alert
	if was != "" {
		l.logger.Info("machine alert cleared by an operator", zap.Stringer("machine", machineID), zap.String("alert", was))
		cur.Alert, cur.AlertAt = "", time.Time{}
		l.markLocked(machineID)
	}

	return was, nil
}

// Raise records an alert about a known machine's identity (one of the Alert constants): it is published on
// the machine in Omni until the machine's own agent tunnel opens again, or, for a contested UUID (two
// machines booting as one), until an operator clears it (ClearAlert); meanwhile no agent call is made. A machine not known is ignored: a
// made-up UUID raises nothing.
func (l *Locations) Raise(machineID metal.ID, alert, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return
	}

	l.logger.Warn("machine alert: its identity is contested", zap.Stringer("machine", machineID), zap.String("site", cur.SiteID),
		zap.String("alert", alert), zap.String("detail", detail))

	l.alerts.WithLabelValues(alert).Inc()

	// A contested UUID is only an operator's to clear: a lesser alert (a second tunnel, another address) must
	// not replace it, or the machine's own tunnel would then clear that one and lift the hold on agent calls.
	if cur.Alert == AlertTunnelContested && alert != AlertTunnelContested {
		return
	}

	cur.Alert, cur.AlertAt = alert, l.now()
	l.markLocked(machineID)
}

// SetArch records the architecture a machine's network boot reported.
func (l *Locations) SetArch(machineID metal.ID, arch metal.Arch) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if cur, ok := l.machines[machineID]; ok && cur.Arch != arch {
		cur.Arch = arch
		l.markLocked(machineID)
	}
}

// firmwareRank orders firmware sources: a machine's own boot request beats a DHCP answer tied to it by MAC;
// an operator's word beats both.
var firmwareRank = map[string]int{"dhcp": 1, "ipxe": 2, "operator": 3}

// SetFirmware records the firmware ("bios" or "uefi"; others are ignored) a source reported: "ipxe" (iPXE's
// ${platform} in the boot request), "dhcp" (option 93) or "operator". A weaker source never overrides a
// stronger one.
func (l *Locations) SetFirmware(machineID metal.ID, firmware, source string) {
	if (firmware != "bios" && firmware != "uefi") || firmwareRank[source] == 0 {
		return
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok || firmwareRank[source] < firmwareRank[cur.FirmwareSource] {
		return
	}

	if cur.Firmware != firmware || cur.FirmwareSource != source {
		cur.Firmware, cur.FirmwareSource = firmware, source
		l.markLocked(machineID)
	}
}

// ErrNotLocated means the machine was never seen at a site (it has not booted through an edge, or it was
// forgotten): there is nothing to attach a boot mode to yet.
var ErrNotLocated = errors.New("machine not seen at any site")

// ErrBadFirmware means a boot mode other than bios, uefi or auto.
var ErrBadFirmware = errors.New(`boot mode must be "bios", "uefi" or "auto"`)

// OverrideFirmware sets an operator's boot mode for machineID (metal.BIOS or metal.UEFI), above anything the
// machine reports, or with "" (the operator's "auto") hands it back to the machine's own reports: the firmware
// known now stays until the machine reports one (so a reboot still knows its mode), and any report replaces
// it. It returns what is assumed now and its source.
func (l *Locations) OverrideFirmware(machineID metal.ID, fw metal.Firmware) (string, string, error) {
	if fw != metal.BIOS && fw != metal.UEFI && fw != "" {
		return "", "", fmt.Errorf("%w: %q", ErrBadFirmware, fw)
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return "", "", fmt.Errorf("%s: %w", machineID, ErrNotLocated)
	}

	firmware, source := string(fw), "operator"
	if fw == "" {
		firmware, source = cur.Firmware, cur.FirmwareSource
		if source == "operator" {
			source = "" // the weakest: the machine's next report wins
		}
	}

	if cur.Firmware != firmware || cur.FirmwareSource != source {
		cur.Firmware, cur.FirmwareSource = firmware, source
		l.markLocked(machineID)
	}

	return cur.Firmware, cur.FirmwareSource, nil
}

// AddMAC records an interface machineID was seen booting from (bounded per machine).
func (l *Locations) AddMAC(machineID metal.ID, mac string) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return
	}

	mac = hw.String()

	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok || slices.Contains(cur.MACs, mac) {
		return
	}

	cur.MACs = append(cur.MACs, mac)
	if len(cur.MACs) > maxMACsPerMachine {
		cur.MACs = cur.MACs[len(cur.MACs)-maxMACsPerMachine:]
	}

	l.markLocked(machineID)
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

	for id, loc := range l.machines {
		if loc.SiteID == siteID && loc.AgentConnected {
			loc.AgentConnected = false
			l.markLocked(id)
		}
	}
}

// Inventory reconciles what siteID's edge holds now (reported at the start of every session) with what the
// controller knows: the machines whose agent tunnels are open there are connected (and placed there when
// located nowhere); every other machine located there is not; machines in the edge's boot table that the
// controller does not know are placed there (the table came from a controller that knew them). Claims on
// machines located at another site are refused and counted. It returns how many claims were refused.
func (l *Locations) Inventory(siteID string, tunnels, table []string) (refused int) {
	open := map[metal.ID]bool{}

	for _, raw := range tunnels {
		id, err := metal.ParsePeerID(raw)
		if err == nil {
			err = l.AgentConnected(siteID, id, true)
		}

		if err != nil {
			l.reject(siteID, "inventory_claim", err)
			refused++

			continue
		}

		open[id] = true
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	for id, loc := range l.machines {
		if loc.SiteID == siteID && loc.AgentConnected && !open[id] {
			loc.AgentConnected = false
			l.markLocked(id)
		}
	}

	for _, raw := range table {
		id, err := metal.ParsePeerID(raw)
		if err != nil {
			continue
		}

		if _, ok := l.machines[id]; !ok {
			l.machines[id] = &Location{SiteID: siteID}
			l.markLocked(id)
		}
	}

	return refused
}

// Forget drops a machine removed from Omni; its record is deleted by Persist.
func (l *Locations) Forget(machineID metal.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if _, ok := l.machines[machineID]; ok {
		delete(l.machines, machineID)
		l.markLocked(machineID)
	}
}

// PowerReported records the power state siteID's edge reported for machineID from watching its BMC; a
// report from a site the machine is not at is ignored.
func (l *Locations) PowerReported(siteID string, machineID metal.ID, reported bmcpb.PowerState, reason string) {
	l.powerReported(siteID, machineID, reported, reason, time.Time{})
}

// powerReported is PowerReported for a state the edge saw at (zero: now). The state is kept by name ("on",
// "off", "unknown"); an unspecified one is ignored.
func (l *Locations) powerReported(siteID string, machineID metal.ID, reported bmcpb.PowerState, reason string, at time.Time) {
	state := reported.Name()
	if state == "" {
		return
	}

	if len(reason) > 256 {
		reason = reason[:256]
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if at.IsZero() {
		at = l.now()
	}

	if cur, ok := l.machines[machineID]; ok && cur.SiteID == siteID {
		if reason == "" && state == cur.Power {
			reason = cur.PowerReason // a list's known states carry no reason: keep the one the change brought
		}

		changed := state != cur.Power || reason != cur.PowerReason
		cur.Power, cur.PowerAt, cur.PowerReason = state, at, reason

		if changed {
			l.changedLocked(machineID)
		}
	}
}

// Loaded is closed once the records kept in Omni have been merged (Load).
func (l *Locations) Loaded() <-chan struct{} { return l.loaded }

// Locate implements SiteLocator.
func (l *Locations) Locate(machineID metal.ID) (Location, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	cur, ok := l.machines[machineID]
	if !ok {
		return Location{}, false
	}

	out := *cur
	out.MACs = slices.Clone(cur.MACs)

	return out, true
}

// AtSite returns the machines located at siteID.
func (l *Locations) AtSite(siteID string) []metal.ID {
	l.mu.Lock()
	defer l.mu.Unlock()

	var out []metal.ID

	for id, loc := range l.machines {
		if loc.SiteID == siteID {
			out = append(out, id)
		}
	}

	slices.Sort(out)

	return out
}

// SiteOf returns the site machineID was last seen at (the machineaccess.Locator shape).
func (l *Locations) SiteOf(machineID metal.ID) (string, bool) {
	loc, ok := l.Locate(machineID)

	return loc.SiteID, ok
}

// ResourceIDs are the locations as the lifecycle and the machine clients ask them: by a machine's Omni
// resource ID, the one string-keyed seam. Omni's machines are named by the IDs their agents reported, in the
// form metal.ParseID returns, so the resource ID is the machine's ID as it stands.
type ResourceIDs struct{ l *Locations }

// ByResourceID returns the locations as looked up by Omni resource IDs.
func (l *Locations) ByResourceID() ResourceIDs { return ResourceIDs{l: l} }

// Locate is Locations.Locate for the machine named id in Omni (lifecycle.SiteLocator).
func (r ResourceIDs) Locate(id string) (Location, bool) { return r.l.Locate(metal.ID(id)) }

// SiteOf is Locations.SiteOf for the machine named id in Omni (machineaccess.Locator).
func (r ResourceIDs) SiteOf(id string) (string, bool) { return r.l.SiteOf(metal.ID(id)) }

// OnChange is Locations.OnChange telling fn the Omni resource ID of each machine that changed.
func (r ResourceIDs) OnChange(fn func(id string)) {
	r.l.OnChange(func(id metal.ID) { fn(id.String()) })
}
