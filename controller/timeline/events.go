package timeline

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/printable"
)

// maxPendingPerAddress bounds the entries held for one address not tied to a machine yet.
const maxPendingPerAddress = 8

// HandleEvent turns an edge event into a timeline entry (it fits bootevents.Handler). DHCP requests and
// firmware fetches name an address, not a machine: they go to the machine a boot script was last served to
// from that address at that site, or are held (bounded) until one is. Events naming no valid machine are
// dropped and counted; HandleEvent never fails, so the edge never resends an event forever.
func (b *Book) HandleEvent(_ context.Context, site string, e *bootpb.Event) error {
	at := b.now()
	if ts := e.GetTime(); ts.IsValid() && !ts.AsTime().After(at.Add(time.Minute)) {
		at = ts.AsTime()
	}

	switch k := e.GetKind().(type) {
	case *bootpb.Event_DhcpSeen:
		d := k.DhcpSeen

		mac, ok := normalMAC(d.GetMac())
		if !ok {
			b.metrics.refused.WithLabelValues("bad_address").Inc()

			return nil
		}

		text := fmt.Sprintf("DHCP from %s, firmware %s", mac, orUnknown(d.Class().Name()))
		if d.GetIpxe() {
			text += ", already in iPXE"
		}

		if d.GetRelay() != "" {
			text += ", relayed by " + d.GetRelay()
		}

		refused := false

		if why := d.GetNotAnswered(); why != "" {
			said, known := notAnswered[why]
			if !known {
				said = printable.String(why, 64)
			}

			text += ": offered nothing, " + said
			refused = why != "secure_boot_disk_plan" // that one is the plan: its firmware goes on to the disk
		}

		firmware := func(m *machine) {
			if fw, ok := d.MachineFirmware(); ok && m.Firmware == "" {
				m.Firmware = string(fw)
			}
		}

		entry := Entry{At: at, Kind: KindDHCP, Text: text, Error: refused}

		// A request that names its machine (option 97) and comes from a MAC no boot script has tied yet starts
		// that machine's timeline: a machine whose boot stops before its boot script is still found by its UUID.
		if id, err := metal.ParsePeerID(d.GetUuid()); err == nil && !b.tied(site, mac) {
			b.addEvent(site, id, entry, func(m *machine) {
				firmware(m)
				b.identify(m, mac, nil)
				b.tieLocked(site, m, "mac/"+mac, b.byMAC, site+"/"+mac)
			})

			return nil
		}

		b.byAddress(site, "mac/"+mac, entry, firmware)
	case *bootpb.Event_PxeSeen:
		p := k.PxeSeen

		ip, ok := normalIP(p.GetRemoteIp())
		if !ok {
			b.metrics.refused.WithLabelValues("bad_address").Inc()

			return nil
		}

		entry := Entry{At: at, Kind: KindPXE, Text: fmt.Sprintf("fetched %s over %s", p.GetFile(), orUnknown(p.GetVia()))}
		if p.GetError() != "" {
			entry.Text = fmt.Sprintf("fetch of %s over %s failed: %s", p.GetFile(), orUnknown(p.GetVia()), p.GetError())
			entry.Error = true
		}

		b.byAddress(site, "ip/"+ip, entry, nil)
	case *bootpb.Event_AssetFetch:
		f := k.AssetFetch

		ip, ok := normalIP(f.GetRemoteIp())
		if !ok {
			b.metrics.refused.WithLabelValues("bad_address").Inc()

			return nil
		}

		file := printable.String(f.GetFile(), 128)
		entry := Entry{At: at, Kind: KindAssetFetch, Text: fmt.Sprintf("downloaded %s (%s)", file, mib(f.GetSize()))}

		if f.GetError() != "" || f.GetSent() < f.GetSize() {
			entry.Text = fmt.Sprintf("download of %s stopped after %s of %s: %s", file, mib(f.GetSent()), mib(f.GetSize()),
				orUnknown(printable.String(f.GetError(), 160)))
			entry.Error = true
		}

		b.byAddress(site, "ip/"+ip, entry, nil)
	case *bootpb.Event_BootServed:
		b.bootServed(site, at, k.BootServed)
	case *bootpb.Event_AgentTunnel:
		t := k.AgentTunnel

		entry := Entry{At: at, Kind: KindAgentDown, Text: "agent tunnel closed"}
		if t.GetOpen() {
			entry = Entry{At: at, Kind: KindAgentUp, Text: "agent tunnel opened from " + orUnknown(t.GetRemoteIp())}
			if t.GetAddressMismatch() {
				entry.Text += " (boot was seen from " + t.GetSeenIp() + ")"
			}
		}

		b.machineEvent(site, t.GetMachineId(), entry, func(m *machine) {
			m.AgentConnected = t.GetOpen()
		})
	case *bootpb.Event_TunnelRefused:
		r := k.TunnelRefused

		why, ok := map[bootpb.TunnelRefusal]string{
			bootpb.TunnelRefusal_TUNNEL_REFUSAL_CONTESTED_MACHINE_ID:    "two machines with this UUID booted lately (a clone, or a forger)",
			bootpb.TunnelRefusal_TUNNEL_REFUSAL_SOURCE_NOT_BOOT_ADDRESS: "it came from another address than the machine booted from",
			bootpb.TunnelRefusal_TUNNEL_REFUSAL_DUPLICATE_MACHINE_ID:    "the machine already has one",
		}[r.ReportedRefusal()]
		if !ok {
			b.metrics.refused.WithLabelValues("bad_event").Inc()

			return nil
		}

		b.machineEvent(site, r.GetMachineId(), Entry{
			At: at, Kind: KindError, Error: true,
			Text: "agent tunnel from " + orUnknown(r.GetRemoteIp()) + " refused: " + why,
		}, nil)
	case *bootpb.Event_PowerChanged:
		p := k.PowerChanged

		state := p.ReportedState()
		entry := Entry{At: at, Kind: KindPower, Text: "BMC reports power " + state.Name()}

		switch state {
		case bmcpb.PowerState_POWER_STATE_ON, bmcpb.PowerState_POWER_STATE_OFF:
		case bmcpb.PowerState_POWER_STATE_UNKNOWN:
			entry.Text, entry.Error = "BMC not answering: "+orUnknown(p.GetError()), true
		default:
			b.metrics.refused.WithLabelValues("bad_event").Inc()

			return nil
		}

		b.machineEvent(site, p.GetMachineId(), entry, nil)
	case *bootpb.Event_ConsoleSession:
		b.machineEvent(site, k.ConsoleSession.GetMachineId(), consoleEntry(at, k.ConsoleSession), nil)
	default:
		b.metrics.refused.WithLabelValues("unknown_event").Inc()
	}

	return nil
}

func (b *Book) bootServed(site string, at time.Time, s *bootpb.BootServed) {
	entry := Entry{At: at, Kind: KindBootServed}

	switch s.GetMode() {
	case "install":
		entry.Kind, entry.Text = KindInstallPlan, "install plan served"
	case "disk":
		entry.Kind, entry.Text = KindDiskBoot, "told to boot from its disk"
	case "deny":
		entry.Text = "network boot refused (machine rejected)"
	case "wait":
		entry.Kind, entry.Error = KindAssetWait, true
		entry.Text = "waits for boot assets the site does not hold yet"

		if w := s.GetWaitingFor(); w != "" {
			entry.Text = "waits to boot " + printable.String(w, 16) + " mode: the site does not hold its boot assets yet"
		}

		if missing := s.GetMissingAssets(); len(missing) > 0 {
			names := make([]string, 0, len(missing))
			for _, m := range missing[:min(len(missing), 4)] {
				names = append(names, printable.String(m, 256))
			}

			entry.Text += ": missing " + strings.Join(names, ", ")
		}
	default:
		entry.Text = "boot script served: " + orUnknown(s.GetMode()) + " mode"
	}

	if s.GetSignedImage() != "" {
		// a machine that enforces Secure Boot: its firmware fetched the signed image its DHCP answer named
		entry.Text = strings.Replace(entry.Text, "boot script served", "signed image served", 1)
		if entry.Kind == KindInstallPlan {
			entry.Text += " as a signed image"
		}
	}

	var details []string

	for _, d := range []string{s.ReportedArch().Name(), s.ReportedPlatform().Name(), s.GetRemoteIp()} {
		if d != "" {
			details = append(details, d)
		}
	}

	if s.GetTableVersion() > 0 {
		details = append(details, fmt.Sprintf("boot table v%d", s.GetTableVersion()))
	}

	if len(details) > 0 {
		entry.Text += " (" + strings.Join(details, ", ") + ")"
	}

	mac, macOK := normalMAC(s.GetMac())
	ip, ipOK := normalIP(s.GetRemoteIp())

	b.machineEvent(site, s.GetUuid(), entry, func(m *machine) {
		b.identify(m, mac, s)

		// the addresses it booted from are its own now: what was held for them joins its timeline
		for _, key := range []struct {
			ok   bool
			key  string
			ties map[string]metal.ID
			addr string
		}{{macOK, "mac/" + mac, b.byMAC, site + "/" + mac}, {ipOK, "ip/" + ip, b.byIP, site + "/" + ip}} {
			if key.ok {
				b.tieLocked(site, m, key.key, key.ties, key.addr)
			}
		}
	})
}

// tieLocked makes an address at site m's (key "mac/..." or "ip/...", addr "<site>/<address>" in ties): what
// was held for it joins m's timeline. b.mu is held.
func (b *Book) tieLocked(site string, m *machine, key string, ties map[string]metal.ID, addr string) {
	if len(ties) >= b.cfg.MaxPending*4 {
		clear(ties)
	}

	ties[addr] = m.ID

	for _, h := range b.pending[site+"/"+key] {
		if h.apply != nil {
			h.apply(m)
		}

		b.appendLocked(m, h.Entry)
	}

	delete(b.pending, site+"/"+key)
}

// tied reports whether a MAC at site is tied to a machine.
func (b *Book) tied(site, mac string) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()

	_, ok := b.byMAC[site+"/"+mac]

	return ok
}

// machineEvent adds an entry to a machine named by an edge event (and applies fn), placing it at the site; an
// ID that is not one is refused and counted.
func (b *Book) machineEvent(site, machineID string, entry Entry, fn func(*machine)) {
	id, err := metal.ParsePeerID(machineID)
	if err != nil {
		b.metrics.refused.WithLabelValues("bad_machine_id").Inc()

		return
	}

	b.addEvent(site, id, entry, fn)
}

// addEvent adds an entry to machine id (and applies fn), placing it at the site.
func (b *Book) addEvent(site string, id metal.ID, entry Entry, fn func(*machine)) {
	b.mu.Lock()
	defer b.mu.Unlock()

	m := b.getLocked(id, true, false)
	if m == nil {
		return
	}

	if m.Site == "" {
		m.Site = site
	}

	if fn != nil {
		fn(m)
	}

	b.appendLocked(m, entry)
}

// identify records how a machine was seen booting; b.mu is held.
func (b *Book) identify(m *machine, mac string, s *bootpb.BootServed) {
	if mac != "" && !slices.Contains(m.MACs, mac) {
		m.MACs = append(m.MACs, mac)
		if len(m.MACs) > maxMACs {
			m.MACs = m.MACs[len(m.MACs)-maxMACs:]
		}
	}

	if s == nil {
		return
	}

	if a, ok := s.MachineArch(); ok {
		m.Arch = string(a)
	}

	if fw, ok := s.MachineFirmware(); ok {
		m.Firmware = string(fw)
	}
}

// maxMACs bounds the interfaces kept per machine.
const maxMACs = 8

// byAddress adds an entry to the machine an address at site is tied to (and applies fn), or holds it for one.
func (b *Book) byAddress(site, key string, entry Entry, fn func(*machine)) {
	b.mu.Lock()
	defer b.mu.Unlock()

	ties := b.byIP
	if strings.HasPrefix(key, "mac/") {
		ties = b.byMAC
	}

	addr := site + "/" + strings.SplitN(key, "/", 2)[1]
	if id, ok := ties[addr]; ok {
		if m := b.machines[id]; m != nil {
			if fn != nil {
				fn(m)
			}

			b.appendLocked(m, entry)

			return
		}
	}

	pk := site + "/" + key

	list, ok := b.pending[pk]
	if !ok && len(b.pending) >= b.cfg.MaxPending {
		b.metrics.refused.WithLabelValues("too_many_pending").Inc()

		return
	}

	entry.Text = clip(entry.Text, b.cfg.MaxText)

	list = append(list, held{Entry: entry, apply: fn})
	if len(list) > maxPendingPerAddress {
		list = list[len(list)-maxPendingPerAddress:]
	}

	b.pending[pk] = list
}

func normalMAC(s string) (string, bool) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", false
	}

	return hw.String(), true
}

func normalIP(s string) (string, bool) {
	ip := net.ParseIP(s)
	if ip == nil {
		return "", false
	}

	return ip.String(), true
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}

	return s
}

// mib is a byte count as a timeline says it.
func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// notAnswered says, for a machine's timeline, why its site's edge offered it nothing (bootpb.DHCPSeen).
var notAnswered = map[string]string{
	"no_boot_file":          "the site has nothing bootable for its firmware",
	"no_signed_boot_file":   "it enforces Secure Boot and the site has no signed image for it (the edge's --secure-boot-file)",
	"secure_boot_disk_plan": "it enforces Secure Boot and its plan is its disk: its firmware goes on to the disk",
	"signed_image_not_at_site": "it enforces Secure Boot and its site's edge does not hold its signed image yet " +
		"(it is being fetched: the firmware's next try gets it)",
	"signed_image_needs_http_boot": "it enforces Secure Boot and asked by PXE: its signed image is served by UEFI HTTP " +
		"boot only (turn HTTP boot on in its firmware)",
}
