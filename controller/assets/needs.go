package assets

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Needs keeps, per site, the assets that site must hold: the ones every site holds (the agent image) and the
// ones its machines' current boot plans name, local files by reference and upstream assets (factory kernels,
// installer images) as wants of the controller's library. It hands each site's set to the catalog, which
// pushes it to the site's edge; the edge fetches (or receives by relay) what it lacks and never evicts what
// is needed. An upstream asset the library does not hold yet is asked of it for every site whose policy is
// not passthrough, and named to the site once held (RunLibrary republishes then); meanwhile the catalog
// lists it as pending.
type Needs struct {
	catalog *Catalog
	library *Library

	mu      sync.Mutex
	common  []*assetsapi.AssetRef
	sites   map[string]map[string]machineNeeds // site -> machine -> needs
	staged  map[string]machineNeeds            // site -> what was staged there
	pending map[string][]waiting               // site -> upstream assets it waits for
}

type machineNeeds struct {
	refs  []*assetsapi.AssetRef
	wants []Want
}

// NewNeeds returns an empty Needs over a catalog; common are held by every site; library holds upstream
// assets (nil: plans name none).
func NewNeeds(catalog *Catalog, library *Library, common []*assetsapi.AssetRef) *Needs {
	return &Needs{
		catalog: catalog, library: library, common: common,
		sites: map[string]map[string]machineNeeds{}, staged: map[string]machineNeeds{}, pending: map[string][]waiting{},
	}
}

// SetStaged records what was staged at a site (controller assets stage): local files by reference,
// upstream assets as wants; the site holds them whatever its plans name.
func (n *Needs) SetStaged(site string, refs []*assetsapi.AssetRef, wants []Want) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.staged[site] = machineNeeds{refs: refs, wants: wants}

	if n.sites[site] == nil {
		n.sites[site] = map[string]machineNeeds{}
	}

	n.publishLocked(site)
}

// Republish hands every site's set to the catalog again: a site's policy changed, or the library holds more.
func (n *Needs) Republish() {
	n.mu.Lock()
	defer n.mu.Unlock()

	for site := range n.sites {
		n.publishLocked(site)
	}
}

// RunLibrary republishes whenever the library comes to hold an asset, and asks again, every
// retryFailedAfter, for what sites still wait for (a fetch that failed is tried again then), until ctx ends.
func (n *Needs) RunLibrary(ctx context.Context) error {
	if n.library == nil {
		return nil
	}

	t := time.NewTicker(retryFailedAfter)
	defer t.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.library.Held():
			n.Republish()
		case <-t.C:
			n.retryWaiting()
		}
	}
}

// retryWaiting republishes the sites that wait for an upstream asset the library may fetch.
func (n *Needs) retryWaiting() {
	n.mu.Lock()
	defer n.mu.Unlock()

	for site, waits := range n.pending {
		if slices.ContainsFunc(waits, func(w waiting) bool { return !w.notStaged }) {
			n.publishLocked(site)
		}
	}
}

// Site makes sure the site is asked for the common assets even before any of its machines has a plan.
func (n *Needs) Site(site string) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if _, ok := n.sites[site]; !ok {
		n.sites[site] = map[string]machineNeeds{}
	}

	n.publishLocked(site)
}

// OnSession asks a connecting site for what it must hold (it fits sites.Options.OnSession); the catalog's
// own OnSession then pushes the set to the edge.
func (n *Needs) OnSession(_ context.Context, site string, _ grpc.ClientConnInterface) error {
	n.Site(site)

	return nil
}

// SetMachine records the assets a machine's current plan at site needs (none: nil): local files by reference,
// upstream assets as wants. A machine is planned at one site only: it leaves any other site's set.
func (n *Needs) SetMachine(site, machine string, refs []*assetsapi.AssetRef, wants ...Want) {
	n.mu.Lock()
	defer n.mu.Unlock()

	for s, machines := range n.sites {
		if _, ok := machines[machine]; ok && s != site {
			delete(machines, machine)
			n.publishLocked(s)
		}
	}

	if n.sites[site] == nil {
		n.sites[site] = map[string]machineNeeds{}
	}

	if len(refs) == 0 && len(wants) == 0 {
		delete(n.sites[site], machine)
	} else {
		n.sites[site][machine] = machineNeeds{refs: refs, wants: wants}
	}

	n.publishLocked(site)
}

// publishLocked hands the site's set, de-duplicated by name and sorted, to the catalog, with the upstream
// assets it waits for. Upstream assets go by the site's policy: a passthrough site's machines fetch them
// themselves (nothing is asked for); a cache site gets what its plans name and what was staged there; an
// offline site gets only what was staged there (controller assets stage), so nothing reaches it unasked, and
// what its plans name beyond that is listed as not staged.
func (n *Needs) publishLocked(site string) {
	byName := map[string]*assetsapi.AssetRef{}
	policy := n.catalog.Policy(site)
	waits := map[string]waiting{}

	for _, r := range n.common {
		byName[r.GetName()] = r
	}

	staged := n.staged[site]
	isStaged := map[string]bool{}

	for _, w := range staged.wants {
		isStaged[w.Key()] = true
	}

	for _, m := range append([]machineNeeds{staged}, slices.Collect(maps.Values(n.sites[site]))...) {
		for _, r := range m.refs {
			byName[r.GetName()] = r
		}

		for _, w := range m.wants {
			switch {
			case n.library == nil, policy == assetsapi.Policy_POLICY_PASSTHROUGH:
				continue
			case policy == assetsapi.Policy_POLICY_OFFLINE && !isStaged[w.Key()]:
				waits[w.Key()] = waiting{want: w, notStaged: true}

				continue
			}

			refs, held := n.library.Refs(w)
			if !held {
				n.library.Want(w)
				waits[w.Key()] = waiting{want: w}
			}

			for _, r := range refs {
				byName[r.GetName()] = r
			}
		}
	}

	out := slices.SortedFunc(maps.Values(byName), func(a, b *assetsapi.AssetRef) int { return strings.Compare(a.GetName(), b.GetName()) })
	n.catalog.SetNeeded(site, out)

	n.pending[site] = slices.SortedFunc(maps.Values(waits), func(a, b waiting) int { return strings.Compare(a.want.Key(), b.want.Key()) })
}

// waiting is an upstream asset a site's plans or staging need that the site cannot be given yet.
type waiting struct {
	want Want
	// notStaged: an offline site's plan names it, but nothing was staged there.
	notStaged bool
}

// notStagedText is the state of an upstream asset an offline site's plan names but nobody staged there.
const notStagedText = "not staged: an offline site gets install assets only through controller assets stage"

// SiteAssets returns a site's asset state as the admin API reports it (it fits sites.AssetState): the
// catalog's, and the upstream assets the site waits for the controller to fetch, with their progress now.
func (n *Needs) SiteAssets(site string) *assetsapi.SiteAssetState {
	out := n.catalog.SiteAssets(site)

	n.mu.Lock()
	waits := n.pending[site]
	n.mu.Unlock()

	for _, w := range waits {
		if w.notStaged {
			out.Upstream = append(out.Upstream, &assetsapi.UpstreamAsset{Key: w.want.Key(), Source: w.want.source(), Error: notStagedText})

			continue
		}

		p, ok := n.library.Progress(w.want)
		if !ok || p.Held {
			continue
		}

		out.Upstream = append(out.Upstream, &assetsapi.UpstreamAsset{
			Key: p.Key, Source: p.Source, BytesDone: p.Done, BytesTotal: p.Total, Error: p.Err,
		})
	}

	return out
}
