// Package timeline keeps, per machine, what happened to it and when, for operators: what the edge saw on
// the site network (DHCP, iPXE fetches, boot scripts served, agent tunnels, BMC power reports) and what the
// lifecycle did (BMC provisioning, wipes, power, phases, errors). Timelines are bounded (the oldest entries
// are dropped and counted) and written to Omni coalesced, so a restarted controller still shows a
// machine's last boot and a fleet of 20,000 machines does not flood Omni.
package timeline

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/printable"
)

// Entry kinds.
const (
	KindDHCP        = "dhcp"
	KindPXE         = "pxe"
	KindBootServed  = "boot-served"
	KindInstallPlan = "install-plan"
	KindDiskBoot    = "disk-boot"
	KindAssetWait   = "asset-wait"
	// KindAssetFetch is a boot asset (kernel, initramfs) sent to the machine whole, or stopped early (Error).
	KindAssetFetch   = "asset-fetch"
	KindAgentUp      = "agent-up"
	KindAgentDown    = "agent-down"
	KindPower        = "power"
	KindBMC          = "bmc"
	KindWipeStarted  = "wipe-started"
	KindWipeFinished = "wipe-finished"
	KindInstalled    = "installed"
	KindPhase        = "phase"
	KindError        = "error"
	KindLifecycle    = "lifecycle"
	// KindIntent is an alert about a destructive call whose outcome nobody knows (the edge restarted during it).
	KindIntent = "intent"
)

// Entry is one thing that happened to a machine.
type Entry struct {
	At   time.Time `json:"time"`
	Kind string    `json:"kind"`
	Text string    `json:"text"`
	// Repeats counts how many more times the same entry came in a row (At is the last time).
	Repeats int  `json:"repeats,omitempty"`
	Error   bool `json:"error,omitempty"`
	// First is when a repeated entry came first (zero until it repeats, and for entries loaded from Omni).
	First time.Time `json:"first,omitzero"`
}

// Since is when the entry (and its repeats) began.
func (e Entry) Since() time.Time {
	if !e.First.IsZero() && e.First.Before(e.At) {
		return e.First
	}

	return e.At
}

// Machine is the summary of one machine: where it is and what the lifecycle last said of it.
type Machine struct {
	ID             metal.ID `json:"id"`
	Site           string   `json:"site"`
	Phase          string   `json:"phase"`
	Power          string   `json:"power"`
	BMCAddress     string   `json:"bmc_address,omitempty"`
	BMCProtocol    string   `json:"bmc_protocol,omitempty"`
	AgentConnected bool     `json:"agent_connected"`
	Waiting        string   `json:"waiting,omitempty"`
	Installed      bool     `json:"installed"`
	// MACs, Arch and Firmware are how the machine was seen booting (boot scripts served, DHCP requests).
	MACs     []string `json:"macs,omitempty"`
	Arch     string   `json:"arch,omitempty"`
	Firmware string   `json:"firmware,omitempty"`
	// Hardware and DrivenOver are the lifecycle's, from the BMC's inventory (MachineSummary); kept in memory
	// only, as the lifecycle gives them again after a restart.
	Hardware   string    `json:"hardware,omitempty"`
	DrivenOver string    `json:"driven_over,omitempty"`
	Updated    time.Time `json:"updated"`
	// Last is the newest timeline entry (zero when none).
	Last Entry `json:"last"`
}

// Record is a machine with its timeline, oldest entry first.
type Record struct {
	Machine

	Entries []Entry `json:"entries"`
	// Dropped counts the earlier entries dropped to keep the timeline bounded.
	Dropped uint64 `json:"dropped"`
}

// Config bounds the book.
type Config struct {
	// MaxEntries is how many entries a machine's timeline keeps (the oldest are dropped and counted).
	MaxEntries int
	// MaxText bounds an entry's text in bytes (edge-supplied strings included).
	MaxText int
	// MaxMachines bounds the machines tracked; edge events about new machines beyond it are refused
	// (the lifecycle's own machines are always tracked).
	MaxMachines int
	// MaxPending bounds the DHCP and firmware-fetch entries held for addresses no machine is known at yet
	// (a machine's first DHCP request comes before its UUID is known).
	MaxPending int
	// WriteInterval is how often changed timelines are written to Omni (each at most once per interval).
	WriteInterval time.Duration
	// RepeatWriteInterval is how often a timeline whose only change is a repeat of its last entry (the same
	// failure again: a site offline for an hour, retried every poll) is written: its count and time wait for
	// this, or for the machine's next real change. At 1,000 machines behind offline sites, one write per
	// retry was 58 Omni updates a second.
	RepeatWriteInterval time.Duration
}

// maxHardware bounds a machine's hardware line (runes): a vendor, a model, CPUs and memory.
const maxHardware = 96

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxEntries: 40, MaxText: 300, MaxMachines: 1 << 17, MaxPending: 4096, WriteInterval: 5 * time.Second, RepeatWriteInterval: 5 * time.Minute}
}

// Book holds every machine's timeline. It is safe for concurrent use.
type Book struct {
	cfg     Config
	now     func() time.Time
	metrics *metrics

	mu       sync.RWMutex
	machines map[metal.ID]*machine
	// byMAC and byIP tie the addresses a machine booted from to its ID (learned from boot scripts served).
	byMAC, byIP map[string]metal.ID
	// pending holds entries for addresses not tied to a machine yet, keyed "<site>/mac/..." or "<site>/ip/...".
	pending map[string][]held
	dirty   map[metal.ID]bool
	// repeated are the machines whose only change since their last write is a repeat (RepeatWriteInterval);
	// repeatsWritten is when those were last written.
	repeated       map[metal.ID]bool
	repeatsWritten time.Time
	// changed is closed and replaced at every change (Changed).
	changed chan struct{}
	version uint64
	// observers see every entry added to a machine's timeline (Observe).
	observers []func(machineID, site string, e Entry)
}

type machine struct {
	Record

	// rawHardware is the lifecycle's hardware line as given, so it is made printable only when it changes
	// (Summarize runs at every status poll of every machine).
	rawHardware string
}

// held is an entry for an address no machine is tied to yet, and what it tells of the machine.
type held struct {
	Entry

	apply func(*machine)
}

// New returns an empty book.
func New(cfg Config, now func() time.Time) *Book {
	d := DefaultConfig()

	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = d.MaxEntries
	}

	if cfg.MaxText <= 0 {
		cfg.MaxText = d.MaxText
	}

	if cfg.MaxMachines <= 0 {
		cfg.MaxMachines = d.MaxMachines
	}

	if cfg.MaxPending <= 0 {
		cfg.MaxPending = d.MaxPending
	}

	if cfg.WriteInterval <= 0 {
		cfg.WriteInterval = d.WriteInterval
	}

	if cfg.RepeatWriteInterval <= 0 {
		cfg.RepeatWriteInterval = d.RepeatWriteInterval
	}

	return &Book{
		cfg: cfg, now: now, metrics: newMetrics(),
		machines: map[metal.ID]*machine{}, byMAC: map[string]metal.ID{}, byIP: map[string]metal.ID{},
		pending: map[string][]held{}, dirty: map[metal.ID]bool{}, repeated: map[metal.ID]bool{}, changed: make(chan struct{}),
		repeatsWritten: now(),
	}
}

// Changed returns a channel closed at the next change of any machine.
func (b *Book) Changed() <-chan struct{} {
	b.mu.RLock()
	defer b.mu.RUnlock()

	return b.changed
}

// Version counts changes; it tells a poller whether anything changed since it last looked.
func (b *Book) Version() uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()

	return b.version
}

// touchLocked marks a machine changed; b.mu is held.
func (b *Book) touchLocked(m *machine) {
	b.changedLocked(m)
	b.dirty[m.ID] = true
	delete(b.repeated, m.ID)
}

// repeatLocked marks m changed by a repeat of its last entry only: watchers see it at once, Omni later.
func (b *Book) repeatLocked(m *machine) {
	b.changedLocked(m)

	if !b.dirty[m.ID] {
		b.repeated[m.ID] = true
	}
}

func (b *Book) changedLocked(m *machine) {
	m.Updated = b.now()
	b.version++

	close(b.changed)
	b.changed = make(chan struct{})
}

// getLocked returns machine id, creating it when create is set and there is room; b.mu is held.
func (b *Book) getLocked(id metal.ID, create, always bool) *machine {
	if m, ok := b.machines[id]; ok {
		return m
	}

	if !create {
		return nil
	}

	if !always && len(b.machines) >= b.cfg.MaxMachines {
		b.metrics.refused.WithLabelValues("too_many_machines").Inc()

		return nil
	}

	m := &machine{Record: Record{Machine: Machine{ID: id}}}
	b.machines[id] = m
	b.metrics.machines.Set(float64(len(b.machines)))

	return m
}

// appendLocked adds an entry to m's timeline, folding it into the last one when it says the same; b.mu is held.
func (b *Book) appendLocked(m *machine, e Entry) {
	e.Text = clip(e.Text, b.cfg.MaxText)

	if n := len(m.Entries); n > 0 {
		last := &m.Entries[n-1]
		if last.Kind == e.Kind && last.Text == e.Text && last.Error == e.Error && !e.At.Before(last.At) {
			b.observeLocked(m, e)

			if last.First.IsZero() {
				last.First = last.At
			}

			last.At = e.At
			last.Repeats++
			m.Last = *last

			b.repeatLocked(m)

			return
		}
	}

	// keep the timeline in time order: an edge's journal may deliver an event after the lifecycle's newer ones
	i := len(m.Entries)
	for i > 0 && m.Entries[i-1].At.After(e.At) {
		i--
	}

	b.observeLocked(m, e)

	m.Entries = slices.Insert(m.Entries, i, e)

	if over := len(m.Entries) - b.cfg.MaxEntries; over > 0 {
		m.Entries = slices.Delete(m.Entries, 0, over)
		m.Dropped += uint64(over)
		b.metrics.dropped.Add(float64(over))
	}

	m.Last = m.Entries[len(m.Entries)-1]

	b.touchLocked(m)
}

// Observe has f called with every entry added to a machine's timeline from now on, repeats included, with the
// machine and its site ("" when unknown): the status pages' fleet history counts boots and failures from them. f
// runs under the book's lock: it must be quick and must not call the book.
func (b *Book) Observe(f func(machineID, site string, e Entry)) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.observers = append(b.observers, f)
}

func (b *Book) observeLocked(m *machine, e Entry) {
	for _, f := range b.observers {
		f(m.ID.String(), m.Site, e)
	}
}

// resourceID is the book's key for a machine the lifecycle names by its Omni resource ID: the ID
// in the lenient form (metal.NormalizeID), not checked, so every machine the lifecycle drives is journaled
// whatever Omni names it.
func resourceID(machineID string) metal.ID { return metal.ID(metal.NormalizeID(machineID)) }

// Record adds an entry to a machine's timeline (it implements lifecycle.Journal).
func (b *Book) Record(machineID, kind, text string, failed bool) {
	id := resourceID(machineID)

	b.mu.Lock()
	defer b.mu.Unlock()

	if m := b.getLocked(id, true, true); m != nil {
		b.appendLocked(m, Entry{At: b.now(), Kind: kind, Text: text, Error: failed})
	}
}

// Summarize takes the lifecycle's summary of a machine (it implements lifecycle.Journal): a change of phase
// and a first install are timeline entries of their own.
func (b *Book) Summarize(machineID string, s lifecycle.MachineSummary) {
	id := resourceID(machineID)

	b.mu.Lock()
	defer b.mu.Unlock()

	m := b.getLocked(id, true, true)
	now := b.now()

	if s.Phase != m.Phase {
		from := m.Phase
		if from == "" {
			from = "unknown"
		}

		m.Phase = s.Phase
		b.appendLocked(m, Entry{At: now, Kind: KindPhase, Text: from + " → " + s.Phase})
	}

	if s.Installed && !m.Installed {
		b.appendLocked(m, Entry{At: now, Kind: KindInstalled, Text: "Omni reported the install"})
	}

	// The inventory's words are the BMC's: shown escaped and bounded, as every peer-supplied string. The
	// protocol is the lifecycle's own word ("redfish" or "ipmi").
	hardware := m.Hardware
	if s.Hardware != m.rawHardware {
		hardware = printable.String(s.Hardware, maxHardware)
	}

	changed := m.Installed != s.Installed || m.Power != s.Power || m.BMCAddress != s.BMCAddress ||
		m.BMCProtocol != s.BMCProtocol || m.Waiting != clip(s.Waiting, b.cfg.MaxText) || (s.Site != "" && m.Site != s.Site) ||
		m.Hardware != hardware || m.DrivenOver != s.DrivenOver

	m.Installed, m.Power, m.BMCAddress, m.BMCProtocol = s.Installed, s.Power, s.BMCAddress, s.BMCProtocol
	m.Waiting = clip(s.Waiting, b.cfg.MaxText)
	m.Hardware, m.rawHardware, m.DrivenOver = hardware, s.Hardware, s.DrivenOver

	if s.Site != "" {
		m.Site = s.Site
	}

	if changed {
		b.touchLocked(m)
	}
}

// Get returns a machine with its timeline.
func (b *Book) Get(id metal.ID) (Record, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()

	m, ok := b.machines[id]
	if !ok {
		return Record{}, false
	}

	out := m.Record
	out.Entries = slices.Clone(m.Entries)
	out.MACs = slices.Clone(m.MACs)

	return out, true
}

// GetByMAC returns the timeline of the machine a network interface belongs to: the machine a boot script tied
// the MAC to at a site, or, for a MAC no boot script has tied (a machine whose boot stops before its script),
// what its site's edge reported of it, with no machine ID (the site where it was seen last).
func (b *Book) GetByMAC(mac string) (Record, bool) {
	mac, ok := normalMAC(mac)
	if !ok {
		return Record{}, false
	}

	b.mu.RLock()

	var (
		held    []Entry
		site    string
		tiedTo  metal.ID
		lastAt  time.Time
		heldFor = "/mac/" + mac
	)

	for addr, id := range b.byMAC {
		if strings.HasSuffix(addr, "/"+mac) {
			tiedTo = id
		}
	}

	if tiedTo == "" {
		for key, list := range b.pending {
			s, found := strings.CutSuffix(key, heldFor)
			if !found || len(list) == 0 || list[len(list)-1].At.Before(lastAt) {
				continue
			}

			site, lastAt, held = s, list[len(list)-1].At, held[:0]
			for _, h := range list {
				held = append(held, h.Entry)
			}
		}
	}

	b.mu.RUnlock()

	if tiedTo != "" {
		return b.Get(tiedTo)
	}

	if site == "" {
		return Record{}, false
	}

	return Record{Machine: Machine{Site: site, MACs: []string{mac}}, Entries: held}, true
}

// Filter selects machines; empty fields match all.
type Filter struct {
	Site string
	// Phase "unknown" selects the machines the lifecycle has not given a phase.
	Phase string
}

func (f Filter) match(m *Machine) bool {
	return (f.Site == "" || m.Site == f.Site) &&
		(f.Phase == "" || m.Phase == f.Phase || (f.Phase == UnknownPhase && m.Phase == ""))
}

// UnknownPhase is the phase of machines the lifecycle has not looked at (known from edge events only).
const UnknownPhase = "unknown"

// List returns the machines f selects, ordered by site then ID, from offset on (at most limit; limit <= 0:
// all), and how many f selects in all.
func (b *Book) List(f Filter, offset, limit int) ([]Machine, int) {
	b.mu.RLock()

	matched := make([]*machine, 0, 256)

	for _, m := range b.machines {
		if f.match(&m.Machine) {
			matched = append(matched, m)
		}
	}

	slices.SortFunc(matched, func(a, b *machine) int {
		return cmp.Or(strings.Compare(a.Site, b.Site), cmp.Compare(a.ID, b.ID))
	})

	total := len(matched)
	offset = min(max(offset, 0), total)

	end := total
	if limit > 0 {
		end = min(offset+limit, total)
	}

	out := make([]Machine, 0, end-offset)
	for _, m := range matched[offset:end] {
		cp := m.Machine
		cp.MACs = slices.Clone(m.MACs)
		out = append(out, cp)
	}

	b.mu.RUnlock()

	return out, total
}

// Phases counts each site's machines by phase.
func (b *Book) Phases() map[string]map[string]int {
	b.mu.RLock()
	defer b.mu.RUnlock()

	out := map[string]map[string]int{}

	for _, m := range b.machines {
		bySite, ok := out[m.Site]
		if !ok {
			bySite = map[string]int{}
			out[m.Site] = bySite
		}

		phase := m.Phase
		if phase == "" {
			phase = UnknownPhase
		}

		bySite[phase]++
	}

	return out
}

// clip bounds s to n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}

	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}

	return s[:n] + "…"
}

// Describe implements prometheus.Collector.
func (b *Book) Describe(ch chan<- *prometheus.Desc) { b.metrics.describe(ch) }

// Collect implements prometheus.Collector.
func (b *Book) Collect(ch chan<- prometheus.Metric) { b.metrics.collect(ch) }
