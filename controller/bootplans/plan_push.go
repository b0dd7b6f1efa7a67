package bootplans

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// TablePusher turns per-machine plans into each site's boot table and hands the tables to Plans, which keeps
// the edges in sync. Push returns once the site's edge acknowledged the table holding the plan (the lifecycle's
// PlanPusher). A machine lives in one site's table: pushed to a new site, it leaves the old one.
// It must be the only writer of the tables of the Plans it is given.
type TablePusher struct {
	plans *Plans

	mu     sync.Mutex
	tables map[string]*bootpb.Table // desired table per site (version set by Plans)
	where  map[string]string        // machine -> site
	config []byte
	sites  map[string]SiteTable // what operators set per site
}

// SiteTable is what an operator set for a site that its boot table carries.
type SiteTable struct {
	// Discovery overrides the edge's own discovery setting (DISCOVERY_UNSPECIFIED: it does not).
	Discovery bootpb.Discovery
	// RegisteredMACs are machines registered before they boot (normalised).
	RegisteredMACs []string
	// ExtraConfig is Talos documents (already checked) served after the join config at this site only.
	ExtraConfig []byte
}

// ParseDiscovery maps an operator's discovery setting to the table's: all, known, off, or empty for the edge's
// own (the boot API's own mapping).
func ParseDiscovery(s string) (bootpb.Discovery, error) { return bootpb.ParseDiscovery(s) }

// NewTablePusher returns a pusher over plans.
func NewTablePusher(plans *Plans) *TablePusher {
	return &TablePusher{plans: plans, tables: map[string]*bootpb.Table{}, where: map[string]string{}, sites: map[string]SiteTable{}}
}

// Push implements the lifecycle's PlanPusher.
func (t *TablePusher) Push(ctx context.Context, site string, plan Plan) (uint64, error) {
	pb, err := ToProto(plan)
	if err != nil {
		return 0, err
	}

	t.mu.Lock()

	if old, ok := t.where[plan.MachineID]; ok && old != site {
		t.remove(old, pb.GetUuid())
		t.plans.Set(old, t.tables[old])
	}

	tbl := t.table(site)

	tbl.Removed = slices.DeleteFunc(tbl.Removed, func(u string) bool { return u == pb.GetUuid() })

	i := slices.IndexFunc(tbl.Plans, func(p *bootpb.Plan) bool { return p.GetUuid() == pb.GetUuid() })
	if i >= 0 {
		tbl.Plans[i] = pb
	} else {
		tbl.Plans = append(tbl.Plans, pb)
		slices.SortFunc(tbl.Plans, func(a, b *bootpb.Plan) int { return strings.Compare(a.GetUuid(), b.GetUuid()) })
	}

	// agent-mode kernels are per site and architecture, the same for every machine
	if plan.Mode == ModeAgent && plan.KernelURL != "" {
		if tbl.Agent == nil {
			tbl.Agent = map[string]*bootpb.Kernel{}
		}

		tbl.Agent[metal.Arch(plan.Arch).IPXE()] = &bootpb.Kernel{KernelUrl: plan.KernelURL, InitrdUrl: plan.InitrdURL}
	}

	t.where[plan.MachineID] = site
	version := t.plans.Set(site, tbl)

	t.mu.Unlock()

	if err = t.plans.WaitAcked(ctx, site, version); err != nil {
		return 0, err
	}

	return version, nil
}

// SetConfig sets the Talos config documents every site serves at /config (Omni's join config).
func (t *TablePusher) SetConfig(config []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()

	t.config = slices.Clone(config)

	for site, tbl := range t.tables {
		tbl.Config = t.siteConfig(site)
		t.plans.Set(site, tbl)
	}
}

// SetSite sets what an operator set for site (the zero SiteTable: nothing) and pushes the site's table when it
// changed.
func (t *TablePusher) SetSite(site string, st SiteTable) {
	t.mu.Lock()
	defer t.mu.Unlock()

	old := t.sites[site]
	if old.Discovery == st.Discovery && slices.Equal(old.RegisteredMACs, st.RegisteredMACs) && bytes.Equal(old.ExtraConfig, st.ExtraConfig) {
		return
	}

	st.RegisteredMACs, st.ExtraConfig = slices.Clone(st.RegisteredMACs), slices.Clone(st.ExtraConfig)
	t.sites[site] = st

	tbl := t.table(site)
	tbl.Discovery, tbl.RegisteredMacs, tbl.Config = st.Discovery, st.RegisteredMACs, t.siteConfig(site)
	t.plans.Set(site, tbl)
}

// siteConfig is the join config followed by the site's own documents.
func (t *TablePusher) siteConfig(site string) []byte {
	extra := t.sites[site].ExtraConfig
	if len(extra) == 0 || len(t.config) == 0 {
		return t.config // no join config yet: a machine must not get the site's documents without it
	}

	out := bytes.TrimRight(slices.Clone(t.config), "\n")
	out = append(out, "\n---\n"...)

	return append(append(out, bytes.TrimSpace(extra)...), '\n')
}

// OnSession gives every connecting site a boot table (it fits sites.Options.OnSession), so the join config
// reaches its edge's /config before any of its machines is known: a new machine needs it to join Omni at all.
// Plans.OnSession then keeps the edge in sync.
func (t *TablePusher) OnSession(_ context.Context, site string, _ grpc.ClientConnInterface) error {
	t.EnsureSite(site)

	return nil
}

// EnsureSite gives a site a table (with the join config) even before any of its machines has a plan.
func (t *TablePusher) EnsureSite(site string) {
	t.mu.Lock()
	defer t.mu.Unlock()

	if _, ok := t.tables[site]; !ok {
		t.plans.Set(site, t.table(site))
	}
}

func (t *TablePusher) table(site string) *bootpb.Table {
	tbl, ok := t.tables[site]
	if !ok {
		st := t.sites[site]
		tbl = &bootpb.Table{Config: t.siteConfig(site), Discovery: st.Discovery, RegisteredMacs: st.RegisteredMACs}
		t.tables[site] = tbl
	}

	return tbl
}

// maxRemoved bounds the removals a site's table remembers for its edge (newest kept).
const maxRemoved = 4096

// remove takes a machine out of a site's table on purpose, and names it in the table's removed list so that
// the edge drops it also from a snapshot (an edge keeps what a snapshot merely leaves out).
func (t *TablePusher) remove(site, uuid string) {
	tbl := t.table(site)
	tbl.Plans = slices.DeleteFunc(tbl.Plans, func(p *bootpb.Plan) bool { return p.GetUuid() == uuid })

	if !slices.Contains(tbl.Removed, uuid) {
		tbl.Removed = append(tbl.Removed, uuid)
		if len(tbl.Removed) > maxRemoved {
			tbl.Removed = slices.Delete(tbl.Removed, 0, len(tbl.Removed)-maxRemoved)
		}
	}
}

// ToProto converts a plan to the boot table's form.
func ToProto(p Plan) (*bootpb.Plan, error) {
	out := &bootpb.Plan{Uuid: strings.ToLower(p.MachineID), Macs: slices.Clone(p.MACs)}

	switch p.Mode {
	case ModeAgent:
		out.Mode = bootpb.Mode_MODE_AGENT
		out.ExtraArgs = slices.Clone(p.KernelArgs)
	case ModeInstall:
		if p.KernelURL == "" {
			return nil, fmt.Errorf("install plan of %s has no kernel (script-only assets cannot go into a boot table)", p.MachineID)
		}

		out.Mode = bootpb.Mode_MODE_INSTALL
		out.Install = &bootpb.Kernel{KernelUrl: p.KernelURL, InitrdUrl: p.InitrdURL, Args: slices.Clone(p.KernelArgs)}
	case ModeDisk:
		out.Mode = bootpb.Mode_MODE_DISK

		switch p.DiskMethod {
		case DiskHTTP404:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_HTTP_404
		case DiskIPXESanboot:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT
		default:
			out.DiskMethod = bootpb.DiskMethod_DISK_METHOD_IPXE_EXIT
		}
	case ModeDeny:
		out.Mode = bootpb.Mode_MODE_DENY
	default:
		return nil, fmt.Errorf("plan of %s: unknown mode %q", p.MachineID, p.Mode)
	}

	return out, nil
}
