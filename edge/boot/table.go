// Package boot holds the edge's boot table: the per-machine boot plans the controller pushes over the
// uplink (full snapshot on connect, then versioned deltas), persisted atomically in the state directory and
// loaded at start so that machines keep booting while the uplink is down. Unknown machines get agent mode.
package boot

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/assetbundle"
	"github.com/outpost-metal/outpost/shared/atomicfile"
	"github.com/outpost-metal/outpost/shared/metal"
)

// FileName is the table's file in the state directory.
const FileName = "boot-table.pb"

// ErrVersionMismatch is returned when a delta does not apply to the held version.
var ErrVersionMismatch = errors.New("delta base version does not match the table")

// ErrInvalid is returned for a snapshot or delta that is not well formed.
var ErrInvalid = errors.New("invalid boot table change")

// Config configures the boot table.
type Config struct {
	// StateDir is the directory the table is persisted in.
	StateDir string
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.StateDir == "" {
		return errors.New("state_dir is required")
	}

	return nil
}

// Table is the boot table. Reads are lock-free (an immutable snapshot behind an atomic pointer);
// changes are serialized, persisted, then published.
type Table struct {
	path string
	log  *zap.Logger

	applyMu sync.Mutex
	cur     atomic.Pointer[snapshot]

	// kept counts plans a snapshot left out without removing them, which the table kept.
	kept prometheus.Counter
}

type snapshot struct {
	table      *bootpb.Table
	byUUID     map[metal.ID]*bootpb.Plan
	byMAC      map[string]*bootpb.Plan
	registered map[string]bool // MACs an operator registered (Table.registered_macs)
}

// Open loads the table from the state directory (an absent file is an empty table at version 0).
// A file that does not decode is moved aside and the table starts empty; the returned table is usable either way.
func Open(cfg Config, logger *zap.Logger) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("boot table config: %w", err)
	}

	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}

	t := &Table{
		path: filepath.Join(cfg.StateDir, FileName), log: logger.With(zap.String("component", "boot-table")),
		kept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_edge_boot_plans_kept_total",
			Help: "Plans a boot table snapshot left out without removing them, kept by the edge.",
		}),
	}

	data, err := os.ReadFile(t.path)

	switch {
	case errors.Is(err, os.ErrNotExist):
		t.cur.Store(index(&bootpb.Table{}))
	case err != nil:
		return nil, fmt.Errorf("read boot table: %w", err)
	default:
		var tbl bootpb.Table
		if err := proto.Unmarshal(data, &tbl); err != nil || validateTable(&tbl) != nil {
			aside := t.path + ".corrupt"
			if rerr := os.Rename(t.path, aside); rerr != nil {
				return nil, fmt.Errorf("move corrupt boot table aside: %w", rerr)
			}

			t.log.Warn("boot table did not decode; moved aside, starting empty", zap.String("moved_to", aside), zap.Error(err))
			t.cur.Store(index(&bootpb.Table{}))
		} else {
			normalizeTable(&tbl)
			t.cur.Store(index(&tbl))
			t.log.Info("boot table loaded", zap.Uint64("version", tbl.GetVersion()), zap.Int("plans", len(tbl.GetPlans())))
		}
	}

	return t, nil
}

// Version returns the version held.
func (t *Table) Version() uint64 {
	return t.cur.Load().table.GetVersion()
}

// UUIDs returns the machine IDs the table holds plans for.
func (t *Table) UUIDs() []string {
	plans := t.cur.Load().table.GetPlans()
	out := make([]string, 0, len(plans))

	for _, p := range plans {
		out = append(out, p.GetUuid())
	}

	return out
}

// Apply applies a snapshot or a delta, persists the result and only then makes it visible.
// It returns the new version (the acknowledgement).
func (t *Table) Apply(req *bootpb.ApplyRequest) (uint64, error) {
	t.applyMu.Lock()
	defer t.applyMu.Unlock()

	cur := t.cur.Load().table

	var next *bootpb.Table

	switch {
	case req.GetSnapshot() != nil:
		next = proto.Clone(req.GetSnapshot()).(*bootpb.Table)
		t.keepLeftOut(cur, next)
	case req.GetDelta() != nil:
		d := req.GetDelta()
		if d.GetBaseVersion() != cur.GetVersion() {
			return 0, fmt.Errorf("delta from %d to %d on version %d: %w", d.GetBaseVersion(), d.GetVersion(), cur.GetVersion(), ErrVersionMismatch)
		}

		if d.GetVersion() <= d.GetBaseVersion() {
			return 0, fmt.Errorf("delta version %d not after %d: %w", d.GetVersion(), d.GetBaseVersion(), ErrInvalid)
		}

		next = applyDelta(cur, d)
	default:
		return 0, fmt.Errorf("neither snapshot nor delta: %w", ErrInvalid)
	}

	if err := validateTable(next); err != nil {
		return 0, err
	}

	normalizeTable(next)

	if err := t.persist(next); err != nil {
		return 0, err
	}

	t.cur.Store(index(next))
	t.log.Info("boot table applied", zap.Uint64("version", next.GetVersion()), zap.Int("plans", len(next.GetPlans())),
		zap.Bool("snapshot", req.GetSnapshot() != nil))

	return next.GetVersion(), nil
}

// keepLeftOut adds to next every plan of cur that the snapshot next neither holds nor names as removed, and
// clears next's removed list (it is an instruction, not state). A controller that restarted and does not know
// all of this site's machines yet must not make them boot agent mode instead of their disks.
func (t *Table) keepLeftOut(cur, next *bootpb.Table) {
	have, removed := map[string]bool{}, map[string]bool{}

	for _, p := range next.GetPlans() {
		have[metal.NormalizeID(p.GetUuid())] = true
	}

	for _, u := range next.GetRemoved() {
		removed[metal.NormalizeID(u)] = true
	}

	next.Removed = nil

	var kept []string

	for _, p := range cur.GetPlans() {
		if !have[p.GetUuid()] && !removed[p.GetUuid()] {
			next.Plans = append(next.Plans, proto.Clone(p).(*bootpb.Plan))
			kept = append(kept, p.GetUuid())
		}
	}

	if len(kept) > 0 {
		t.kept.Add(float64(len(kept)))
		t.log.Warn("boot table snapshot leaves out machines this edge holds; their plans are kept until the controller removes them",
			zap.Int("kept", len(kept)), zap.Strings("machines", kept[:min(len(kept), 20)]))
	}
}

// Collectors returns the table's metrics for the caller to register.
func (t *Table) Collectors() []prometheus.Collector { return []prometheus.Collector{t.kept} }

func applyDelta(cur *bootpb.Table, d *bootpb.Delta) *bootpb.Table {
	next := proto.Clone(cur).(*bootpb.Table)
	next.Version = d.GetVersion()

	drop := map[string]bool{}
	for _, u := range d.GetRemove() {
		drop[metal.NormalizeID(u)] = true
	}

	for _, p := range d.GetUpsert() {
		drop[metal.NormalizeID(p.GetUuid())] = true
	}

	plans := next.GetPlans()[:0]
	for _, p := range next.GetPlans() {
		if !drop[p.GetUuid()] {
			plans = append(plans, p)
		}
	}

	for _, p := range d.GetUpsert() {
		plans = append(plans, proto.Clone(p).(*bootpb.Plan))
	}

	next.Plans = plans

	if d.GetReplaceAgent() {
		next.Agent = d.GetAgent()
	}

	if d.GetReplaceKernelArgs() {
		next.KernelArgs = d.GetKernelArgs()
	}

	if d.GetReplaceConfig() {
		next.Config = d.GetConfig()
	}

	if d.GetReplaceDiscovery() {
		next.Discovery = d.GetDiscovery()
	}

	if d.GetReplaceRegisteredMacs() {
		next.RegisteredMacs = d.GetRegisteredMacs()
	}

	if d.GetReplaceDhcp() {
		next.Dhcp = d.GetDhcp()
	}

	if d.GetReplaceSecureBoot() {
		next.SecureBoot = d.GetSecureBoot()
	}

	if d.GetReplaceSignedAgent() {
		next.SignedAgent = d.GetSignedAgent()
	}

	return next
}

// MaxRegisteredMACs bounds the MACs an operator may register at one site.
const MaxRegisteredMACs = 65536

func validateTable(tbl *bootpb.Table) error {
	if _, ok := bootpb.Discovery_name[int32(tbl.GetDiscovery())]; !ok {
		return fmt.Errorf("discovery %d: %w", tbl.GetDiscovery(), ErrInvalid)
	}

	if _, ok := bootpb.SecureBoot_name[int32(tbl.GetSecureBoot())]; !ok {
		return fmt.Errorf("secure boot %d: %w", tbl.GetSecureBoot(), ErrInvalid)
	}

	for arch, img := range tbl.GetSignedAgent() {
		if (arch != metal.AMD64.IPXE() && arch != metal.ARM64.IPXE()) || img == nil {
			return fmt.Errorf("signed agent image for %.20q: want x86_64 or arm64: %w", arch, ErrInvalid)
		}

		if err := checkSignedImage(img); err != nil {
			return fmt.Errorf("signed agent image for %s: %w: %w", arch, err, ErrInvalid)
		}
	}

	if n := len(tbl.GetRegisteredMacs()); n > MaxRegisteredMACs {
		return fmt.Errorf("%d registered MACs, at most %d: %w", n, MaxRegisteredMACs, ErrInvalid)
	}

	for _, m := range tbl.GetRegisteredMacs() {
		if _, err := net.ParseMAC(m); err != nil {
			return fmt.Errorf("registered mac %q: %w", m, ErrInvalid)
		}
	}

	if err := tbl.GetDhcp().Check(); err != nil {
		return fmt.Errorf("dhcp: %w: %w", err, ErrInvalid)
	}

	seen := map[string]bool{}

	for i, p := range tbl.GetPlans() {
		u := metal.NormalizeID(p.GetUuid())
		if u == "" {
			return fmt.Errorf("plan %d has no uuid: %w", i, ErrInvalid)
		}

		if seen[u] {
			return fmt.Errorf("plan %s twice: %w", u, ErrInvalid)
		}

		seen[u] = true

		for _, m := range p.GetMacs() {
			if _, err := net.ParseMAC(m); err != nil {
				return fmt.Errorf("plan %s mac %q: %w", u, m, ErrInvalid)
			}
		}

		if _, ok := bootpb.Mode_name[int32(p.GetMode())]; !ok {
			return fmt.Errorf("plan %s mode %d: %w", u, p.GetMode(), ErrInvalid)
		}

		if p.GetMode() == bootpb.Mode_MODE_INSTALL && p.GetInstall().GetKernelUrl() == "" && p.GetSignedImage() == nil {
			return fmt.Errorf("plan %s: install mode without a kernel or a signed image: %w", u, ErrInvalid)
		}

		if err := checkSignedImage(p.GetSignedImage()); err != nil {
			return fmt.Errorf("plan %s: signed image: %w: %w", u, err, ErrInvalid)
		}
	}

	return nil
}

// maxSignedURL bounds a signed image's URL: a DHCP reply carries it whole (option 67 holds 255 bytes, with
// the edge's own address in front of an edge-relative one).
const maxSignedURL = 200

// checkSignedImage checks a plan's signed image (nil: none): an edge-relative /assets/ name or an absolute
// http(s) URL, each one word the firmware can take.
func checkSignedImage(img *bootpb.SignedImage) error {
	if img == nil {
		return nil
	}

	if img.GetUrl() == "" {
		return errors.New("no url")
	}

	for _, u := range []string{img.GetUrl(), img.GetUpstreamUrl()} {
		if u == "" {
			continue
		}

		if len(u) > maxSignedURL || strings.ContainsFunc(u, func(r rune) bool { return r <= ' ' || r == 0x7f || r > 0x7e }) {
			return fmt.Errorf("%.40q: want at most %d printable characters", u, maxSignedURL)
		}

		if name, ok := strings.CutPrefix(u, "/assets/"); ok {
			if err := assetbundle.ValidateName(name); err != nil {
				return fmt.Errorf("%q: %w", u, err)
			}

			continue
		}

		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("%q: want /assets/<name> or an http(s) URL", u)
		}
	}

	return nil
}

func normalizeTable(tbl *bootpb.Table) {
	for i, m := range tbl.GetRegisteredMacs() {
		if hw, err := net.ParseMAC(m); err == nil {
			tbl.RegisteredMacs[i] = hw.String()
		}
	}

	for _, p := range tbl.GetPlans() {
		p.Uuid = metal.NormalizeID(p.GetUuid())

		for i, m := range p.GetMacs() {
			if hw, err := net.ParseMAC(m); err == nil {
				p.Macs[i] = hw.String()
			}
		}
	}
}

func index(tbl *bootpb.Table) *snapshot {
	s := &snapshot{table: tbl, byUUID: map[metal.ID]*bootpb.Plan{}, byMAC: map[string]*bootpb.Plan{}, registered: map[string]bool{}}

	for _, m := range tbl.GetRegisteredMacs() {
		s.registered[m] = true
	}

	for _, p := range tbl.GetPlans() {
		s.byUUID[metal.ID(p.GetUuid())] = p // normalized by normalizeTable

		for _, m := range p.GetMacs() {
			s.byMAC[m] = p
		}
	}

	return s
}

// persist writes the table to a temporary file, syncs it and renames it over the old one,
// then syncs the directory, so a crash leaves either the old or the new table.
func (t *Table) persist(tbl *bootpb.Table) error {
	data, err := proto.Marshal(tbl)
	if err != nil {
		return fmt.Errorf("encode boot table: %w", err)
	}

	if err := atomicfile.Write(t.path, data, 0o600); err != nil {
		return fmt.Errorf("persist boot table: %w", err)
	}

	return nil
}

// Entry is the resolved plan of one machine, ready to render.
type Entry struct {
	// Known is false for a machine the table does not name (it gets agent mode).
	Known      bool
	UUID       metal.ID
	Mode       bootpb.Mode
	DiskMethod bootpb.DiskMethod
	// Install is set in install mode.
	Install *bootpb.Kernel
	// Agent is the table's agent kernel for the requested arch, nil when the table has none.
	Agent *bootpb.Kernel
	// KernelArgs are the table-wide args (consoles); empty when the controller sent none.
	KernelArgs []string
	// ExtraArgs are the machine's own args, to append after KernelArgs.
	ExtraArgs []string
	Version   uint64
}

// idOf is the table's key for a machine ID as a peer wrote it (a DHCP client's option 97, a query).
func idOf(uuid string) metal.ID { return metal.ID(metal.NormalizeID(uuid)) }

// Lookup resolves a machine by UUID, then by MAC; Agent is the table's agent kernel for arch. The returned
// messages must not be modified.
func (t *Table) Lookup(uuid metal.ID, mac net.HardwareAddr, arch metal.Arch) Entry {
	s := t.cur.Load()
	e := Entry{UUID: idOf(uuid.String()), Version: s.table.GetVersion(), Agent: s.table.GetAgent()[arch.IPXE()]}

	p := s.find(e.UUID, mac)
	if p != nil {
		e.Known = true
		e.Mode = p.GetMode()
		e.DiskMethod = p.GetDiskMethod()
		e.Install = p.GetInstall()
	}

	e.KernelArgs = s.table.GetKernelArgs()
	e.ExtraArgs = p.GetExtraArgs()

	return e
}

func (s *snapshot) find(uuid metal.ID, mac net.HardwareAddr) *bootpb.Plan {
	if uuid != "" {
		if p, ok := s.byUUID[uuid]; ok {
			return p
		}
	}

	if len(mac) > 0 {
		return s.byMAC[mac.String()]
	}

	return nil
}

// SNPOnly reports whether the machine must get the SNP-only UEFI binary (dhcp.Preferences).
func (t *Table) SNPOnly(mac net.HardwareAddr, uuid string) bool {
	return t.cur.Load().find(idOf(uuid), mac).GetSnpOnly()
}

// DiskPlan reports whether the machine's plan is to boot its disk (dhcp.Preferences).
func (t *Table) DiskPlan(mac net.HardwareAddr, uuid string) bool {
	return t.cur.Load().find(idOf(uuid), mac).GetMode() == bootpb.Mode_MODE_DISK
}

// SecureBoot reports whether the machine's plan says its firmware enforces Secure Boot, else what the site's
// setting says for machines whose plan does not (a machine booting for the first time has none); said is false
// when neither says (dhcp.Preferences).
func (t *Table) SecureBoot(mac net.HardwareAddr, uuid string) (enforces, said bool) {
	s := t.cur.Load()

	sb := s.find(idOf(uuid), mac).GetSecureBoot()
	if sb == bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED {
		sb = s.table.GetSecureBoot()
	}

	switch sb {
	case bootpb.SecureBoot_SECURE_BOOT_ON:
		return true, true
	case bootpb.SecureBoot_SECURE_BOOT_OFF:
		return false, true
	default:
		return false, false
	}
}

// SignedBootQuery is what the ProxyDHCP appends to the URL of a signed image it offers a machine (its UUID
// and MAC): the edge's HTTP server takes the image's fetch as the evidence of the machine's boot that its
// agent's tunnel is bound to, as a boot script's fetch is for the others (such a machine runs no script).
func SignedBootQuery(uuid string, mac net.HardwareAddr) string {
	return "?uuid=" + uuid + "&mac=" + mac.String()
}

// SignedImage returns the signed image of the machine's plan when its plan is agent mode or an install, else,
// for a machine in agent mode whose plan names none (or that has no plan), the site's signed agent image for
// its architecture; nil otherwise (a disk or deny plan, or none named) (dhcp.Preferences).
func (t *Table) SignedImage(mac net.HardwareAddr, uuid string, arch metal.Arch) *bootpb.SignedImage {
	s := t.cur.Load()
	p := s.find(idOf(uuid), mac)

	switch {
	case p.GetMode() != bootpb.Mode_MODE_AGENT && p.GetMode() != bootpb.Mode_MODE_INSTALL:
		return nil
	case p.GetSignedImage() != nil:
		return p.GetSignedImage()
	case p.GetMode() == bootpb.Mode_MODE_AGENT:
		return s.table.GetSignedAgent()[arch.IPXE()]
	default:
		return nil
	}
}

// Known reports whether the table holds the machine: a plan for it (by UUID, or by one of the MACs a plan
// names), or its MAC among those an operator registered before it booted.
func (t *Table) Known(mac net.HardwareAddr, uuid string) bool {
	s := t.cur.Load()

	return s.find(idOf(uuid), mac) != nil || (len(mac) > 0 && s.registered[mac.String()])
}

// Discovery is the site's discovery policy as the controller set it: all, known or off; "" when it set none
// (dhcp.Preferences).
func (t *Table) Discovery() string {
	return t.cur.Load().table.GetDiscovery().Policy()
}

// DHCP is the site's DHCP service as the controller set it (checked; nil when it set none: the edge's own).
// The message must not be modified; it stays the same pointer until the table changes.
func (t *Table) DHCP() *bootpb.DHCP {
	return t.cur.Load().table.GetDhcp()
}

// MachineConfig returns the config to serve at /config for a machine (its own, else the table's);
// nil when the controller has sent none.
func (t *Table) MachineConfig(uuid string) []byte {
	s := t.cur.Load()
	if p := s.find(idOf(uuid), nil); len(p.GetConfig()) > 0 {
		return p.GetConfig()
	}

	return s.table.GetConfig()
}
