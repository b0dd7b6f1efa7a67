// Package boottables holds each site's boot table on the controller and keeps the site's edge in step with it:
// the machines' plans (Push, the lifecycle's PlanPusher), the join config every site serves at /config, and
// what an operator set per site. It is the one place the controller keeps boot-plan state: the table each
// site should have and the last one its edge acknowledged. A session starts with a snapshot, then sends
// deltas, each acknowledged by the edge once persisted.
package boottables

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/bootplans"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Tables holds every site's boot table. A machine lives in one site's table: pushed to a new site, it leaves
// the old one. It is a prometheus Collector of its own metrics: how long a table waited for its edge's
// acknowledgement, one push's duration, and how many sites' edges have not acknowledged their latest table.
type Tables struct {
	log *zap.Logger
	now func() time.Time

	mu     sync.Mutex
	sites  map[string]*site
	placed map[metal.ID]placement // by machine ID: where its plan is in the tables
	config []byte                 // the join config, served by every site
	// onReach is told of every site whose edge said something new of how its machines reach it (nil: nobody).
	onReach func(siteID string)

	ackLag   prometheus.Histogram
	unacked  prometheus.GaugeFunc
	pushTime prometheus.Histogram
}

// placement is where a machine's plan is: the site whose table holds it, the plan as pushed, and the version
// of that table which first held it (what the edge must have acknowledged to hold it).
type placement struct {
	site    string
	plan    bootplans.Plan
	version uint64
}

type site struct {
	// desired is the table the site should have; never changed in place (a session may be sending it).
	desired *bootpb.Table
	// acked is the last table the edge acknowledged in the current or last session.
	acked *bootpb.Table
	// changed is closed and replaced whenever desired or acked changes.
	changed chan struct{}
	// reach is how the site's machines reach its edge, as its last acknowledgement said (nil: not said).
	reach *bootpb.Reach
	// settings are what an operator set for the site.
	settings SiteTable
}

// SiteTable is what an operator set for a site that its boot table carries.
type SiteTable struct {
	// Discovery overrides the edge's own discovery setting (DISCOVERY_UNSPECIFIED: it does not).
	Discovery bootpb.Discovery
	// RegisteredMACs are machines registered before they boot (normalised).
	RegisteredMACs []string
	// ExtraConfig is Talos documents (already checked) served after the join config at this site only.
	ExtraConfig []byte
	// DHCP is the site's DHCP service (already checked; nil: the edge's own). Not changed in place.
	DHCP *bootpb.DHCP
	// SecureBoot is the site's Secure Boot setting, for machines whose plan does not say (unspecified: the
	// edge's own setting).
	SecureBoot bootpb.SecureBoot
}

// New returns Tables without any site. now stamps versions (nil means time.Now).
func New(logger *zap.Logger, now func() time.Time) *Tables {
	if now == nil {
		now = time.Now
	}

	t := &Tables{
		log: logger.With(zap.String("component", "boottables")), now: now,
		sites: map[string]*site{}, placed: map[metal.ID]placement{},
	}

	t.ackLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "ack_lag_seconds",
		Help:    "From a site's boot table changing to its edge acknowledging that version (or a later one).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms to 262 s
	})
	t.pushTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "push_duration_seconds",
		Help:    "One push of a boot table (snapshot or delta) to an edge, until its acknowledgement.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
	t.unacked = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "outpost", Subsystem: "boot_plans", Name: "sites_unacknowledged",
		Help: "Sites whose edge has not acknowledged the latest boot table (offline sites among them).",
	}, t.countUnacked)

	return t
}

// Describe implements prometheus.Collector.
func (t *Tables) Describe(ch chan<- *prometheus.Desc) {
	t.ackLag.Describe(ch)
	t.pushTime.Describe(ch)
	t.unacked.Describe(ch)
}

// Collect implements prometheus.Collector.
func (t *Tables) Collect(ch chan<- prometheus.Metric) {
	t.ackLag.Collect(ch)
	t.pushTime.Collect(ch)
	t.unacked.Collect(ch)
}

func (t *Tables) countUnacked() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()

	n := 0

	for _, st := range t.sites {
		if st.desired.GetVersion() > st.acked.GetVersion() {
			n++
		}
	}

	return float64(n)
}

// Push implements the lifecycle's PlanPusher: it puts a machine's plan into its site's table (taking it out of
// the table of the site it was at before) and returns once the site's edge acknowledged a table holding it,
// at once when the edge already holds it.
func (t *Tables) Push(ctx context.Context, siteID string, plan bootplans.Plan) (uint64, error) {
	pb, err := bootplans.ToProto(plan)
	if err != nil {
		return 0, err
	}

	t.mu.Lock()

	old, ok := t.placed[plan.MachineID]
	if ok && old.site != siteID {
		t.changeLocked(old.site, func(tbl *bootpb.Table) { removePlan(tbl, pb.GetUuid()) })
	}

	version := old.version
	if !ok || old.site != siteID || !old.plan.Equal(plan) || !holdsAgent(t.siteLocked(siteID).desired, plan) {
		version = t.changeLocked(siteID, func(tbl *bootpb.Table) { putPlan(tbl, pb, plan) })
		plan.KernelArgs, plan.MACs = slices.Clone(plan.KernelArgs), slices.Clone(plan.MACs)
		t.placed[plan.MachineID] = placement{site: siteID, plan: plan, version: version}
	}

	t.mu.Unlock()

	if err := t.waitAcked(ctx, siteID, version); err != nil {
		return 0, err
	}

	return version, nil
}

// Holds reports whether site's edge acknowledged a table holding plan, and the site's table still holds it:
// an operation that depends on the plan (power-on, reboot) may go ahead without pushing it again.
func (t *Tables) Holds(siteID string, plan bootplans.Plan) bool {
	t.mu.Lock()
	defer t.mu.Unlock()

	p, ok := t.placed[plan.MachineID]
	if !ok || p.site != siteID || !p.plan.Equal(plan) {
		return false
	}

	acked := t.sites[siteID].acked

	return acked.GetVersion() >= p.version && holdsAgent(acked, plan)
}

// SetConfig sets the Talos config documents every site serves at /config (Omni's join config).
func (t *Tables) SetConfig(config []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()

	t.config = slices.Clone(config)

	for id := range t.sites {
		t.changeLocked(id, func(tbl *bootpb.Table) { tbl.Config = t.siteConfigLocked(id) })
	}
}

// SetSite sets what an operator set for a site (the zero SiteTable: nothing) and changes the site's table when
// it changed.
func (t *Tables) SetSite(siteID string, set SiteTable) {
	t.mu.Lock()
	defer t.mu.Unlock()

	st := t.siteLocked(siteID)

	old := st.settings
	if old.Discovery == set.Discovery && slices.Equal(old.RegisteredMACs, set.RegisteredMACs) && bytes.Equal(old.ExtraConfig, set.ExtraConfig) &&
		proto.Equal(old.DHCP, set.DHCP) && old.SecureBoot == set.SecureBoot {
		return
	}

	set.RegisteredMACs, set.ExtraConfig = slices.Clone(set.RegisteredMACs), slices.Clone(set.ExtraConfig)
	if set.DHCP != nil {
		set.DHCP = proto.Clone(set.DHCP).(*bootpb.DHCP)
	}

	st.settings = set

	t.changeLocked(siteID, func(tbl *bootpb.Table) {
		tbl.Discovery, tbl.RegisteredMacs, tbl.Config = set.Discovery, set.RegisteredMACs, t.siteConfigLocked(siteID)
		tbl.Dhcp, tbl.SecureBoot = set.DHCP, set.SecureBoot
	})
}

// SetSignedAgent sets a site's signed agent images per iPXE architecture (nil: none), which its edge offers a
// machine that enforces Secure Boot and has no plan naming one (a first boot), and changes the site's table
// when they changed.
func (t *Tables) SetSignedAgent(siteID string, images map[string]*bootpb.SignedImage) {
	t.mu.Lock()
	defer t.mu.Unlock()

	st := t.siteLocked(siteID)
	if maps.EqualFunc(st.desired.GetSignedAgent(), images, func(a, b *bootpb.SignedImage) bool { return proto.Equal(a, b) }) {
		return
	}

	images = maps.Clone(images)

	t.changeLocked(siteID, func(tbl *bootpb.Table) { tbl.SignedAgent = images })
}

// siteConfigLocked is the join config followed by the site's own documents.
func (t *Tables) siteConfigLocked(siteID string) []byte {
	var extra []byte
	if st, ok := t.sites[siteID]; ok {
		extra = st.settings.ExtraConfig
	}

	if len(extra) == 0 || len(t.config) == 0 {
		return t.config // no join config yet: a machine must not get the site's documents without it
	}

	out := bytes.TrimRight(slices.Clone(t.config), "\n")
	out = append(out, "\n---\n"...)

	return append(append(out, bytes.TrimSpace(extra)...), '\n')
}

// OnReach calls fn (outside any lock) whenever a site's edge says something new of how its machines reach it.
// Set it before sessions start.
func (t *Tables) OnReach(fn func(siteID string)) {
	t.mu.Lock()
	defer t.mu.Unlock()

	t.onReach = fn
}

// Reach is how a site's machines reach its edge, as the edge said when it last acknowledged a table (nil: it
// has not said, or it does not know): what a signed image's locked command line must name (lifecycle.SiteReach).
func (t *Tables) Reach(siteID string) *bootpb.Reach {
	t.mu.Lock()
	defer t.mu.Unlock()

	if st, ok := t.sites[siteID]; ok {
		return st.reach
	}

	return nil
}

// siteLocked returns a site's state, giving a new site its first table (the join config and its settings), so
// the join config reaches its edge's /config before any of its machines is known: a new machine needs it to
// join Omni at all.
func (t *Tables) siteLocked(siteID string) *site {
	st, ok := t.sites[siteID]
	if !ok {
		st = &site{changed: make(chan struct{})}
		t.sites[siteID] = st
		st.desired = &bootpb.Table{Config: t.siteConfigLocked(siteID), Version: t.nextVersion(nil)}
	}

	return st
}

// changeLocked makes a changed copy of a site's desired table the new desired table and returns its version.
func (t *Tables) changeLocked(siteID string, change func(*bootpb.Table)) uint64 {
	st := t.siteLocked(siteID)

	next := proto.Clone(st.desired).(*bootpb.Table)
	change(next)
	next.Version = t.nextVersion(st.desired)

	st.desired = next
	st.notify()

	return next.Version
}

// nextVersion is the version of the table after prev. Versions come from the clock and always increase, so
// they keep increasing across controller restarts.
func (t *Tables) nextVersion(prev *bootpb.Table) uint64 {
	v := uint64(t.now().UnixNano())
	if v <= prev.GetVersion() {
		v = prev.GetVersion() + 1
	}

	return v
}

func (st *site) notify() {
	close(st.changed)
	st.changed = make(chan struct{})
}

// waitAcked blocks until the site's edge has acknowledged version (or a later one) or ctx ends.
func (t *Tables) waitAcked(ctx context.Context, siteID string, version uint64) error {
	for {
		t.mu.Lock()
		st := t.siteLocked(siteID)
		acked, ch := st.acked.GetVersion(), st.changed
		t.mu.Unlock()

		if acked >= version {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for site %s to acknowledge boot table %d: %w", siteID, version, ctx.Err())
		case <-ch:
		}
	}
}

// holdsAgent reports whether tbl has an agent-mode plan's kernel for its architecture (agent kernels are per
// site and architecture: another machine's plan may have changed it); true for other plans.
func holdsAgent(tbl *bootpb.Table, plan bootplans.Plan) bool {
	if plan.Mode != bootplans.ModeAgent || plan.KernelURL == "" {
		return true
	}

	k := tbl.GetAgent()[plan.Arch.IPXE()]

	return k.GetKernelUrl() == plan.KernelURL && k.GetInitrdUrl() == plan.InitrdURL
}

// putPlan puts a machine's plan into tbl, in UUID order, and no longer names it removed.
func putPlan(tbl *bootpb.Table, pb *bootpb.Plan, plan bootplans.Plan) {
	tbl.Removed = slices.DeleteFunc(tbl.Removed, func(u string) bool { return u == pb.GetUuid() })

	i, ok := slices.BinarySearchFunc(tbl.Plans, pb.GetUuid(), func(p *bootpb.Plan, uuid string) int {
		return strings.Compare(p.GetUuid(), uuid)
	})
	if ok {
		tbl.Plans[i] = pb
	} else {
		tbl.Plans = slices.Insert(tbl.Plans, i, pb)
	}

	// agent-mode kernels are per site and architecture, the same for every machine
	if plan.Mode == bootplans.ModeAgent && plan.KernelURL != "" {
		if tbl.Agent == nil {
			tbl.Agent = map[string]*bootpb.Kernel{}
		}

		tbl.Agent[plan.Arch.IPXE()] = &bootpb.Kernel{KernelUrl: plan.KernelURL, InitrdUrl: plan.InitrdURL}
	}
}

// maxRemoved bounds the removals a site's table remembers for its edge (newest kept).
const maxRemoved = 4096

// removePlan takes a machine out of tbl on purpose, and names it in the table's removed list so that the edge
// drops it also from a snapshot (an edge keeps what a snapshot merely leaves out).
func removePlan(tbl *bootpb.Table, uuid string) {
	tbl.Plans = slices.DeleteFunc(tbl.Plans, func(p *bootpb.Plan) bool { return p.GetUuid() == uuid })

	if !slices.Contains(tbl.Removed, uuid) {
		tbl.Removed = append(tbl.Removed, uuid)
		if len(tbl.Removed) > maxRemoved {
			tbl.Removed = slices.Delete(tbl.Removed, 0, len(tbl.Removed)-maxRemoved)
		}
	}
}
