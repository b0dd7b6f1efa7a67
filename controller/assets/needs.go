package assets

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"

	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

// Needs keeps, per site, the assets that site must hold: the ones every site holds (the agent image) and the
// ones its machines' current boot plans name. It hands each site's set to the catalog, which pushes it to the
// site's edge; the edge fetches (or receives by relay) what it lacks and never evicts what is needed.
type Needs struct {
	catalog *Catalog

	mu     sync.Mutex
	common []*assetsapi.AssetRef
	sites  map[string]map[string][]*assetsapi.AssetRef // site -> machine -> refs
}

// NewNeeds returns an empty Needs over a catalog; common are held by every site.
func NewNeeds(catalog *Catalog, common []*assetsapi.AssetRef) *Needs {
	return &Needs{catalog: catalog, common: common, sites: map[string]map[string][]*assetsapi.AssetRef{}}
}

// Site makes sure the site is asked for the common assets even before any of its machines has a plan.
func (n *Needs) Site(site string) {
	n.mu.Lock()
	defer n.mu.Unlock()

	if _, ok := n.sites[site]; !ok {
		n.sites[site] = map[string][]*assetsapi.AssetRef{}
	}

	n.publishLocked(site)
}

// OnSession asks a connecting site for what it must hold (it fits sites.Options.OnSession); the catalog's
// own OnSession then pushes the set to the edge.
func (n *Needs) OnSession(_ context.Context, site string, _ grpc.ClientConnInterface) error {
	n.Site(site)

	return nil
}

// SetMachine records the assets a machine's current plan at site needs (none: nil). A machine is planned at
// one site only: it leaves any other site's set.
func (n *Needs) SetMachine(site, machine string, refs []*assetsapi.AssetRef) {
	n.mu.Lock()
	defer n.mu.Unlock()

	for s, machines := range n.sites {
		if _, ok := machines[machine]; ok && s != site {
			delete(machines, machine)
			n.publishLocked(s)
		}
	}

	if n.sites[site] == nil {
		n.sites[site] = map[string][]*assetsapi.AssetRef{}
	}

	if len(refs) == 0 {
		delete(n.sites[site], machine)
	} else {
		n.sites[site][machine] = refs
	}

	n.publishLocked(site)
}

// publishLocked hands the site's set, de-duplicated by name and sorted, to the catalog.
func (n *Needs) publishLocked(site string) {
	byName := map[string]*assetsapi.AssetRef{}

	for _, r := range n.common {
		byName[r.GetName()] = r
	}

	for _, refs := range n.sites[site] {
		for _, r := range refs {
			byName[r.GetName()] = r
		}
	}

	out := make([]*assetsapi.AssetRef, 0, len(byName))
	for _, r := range byName {
		out = append(out, r)
	}

	slices.SortFunc(out, func(a, b *assetsapi.AssetRef) int { return strings.Compare(a.GetName(), b.GetName()) })

	n.catalog.SetNeeded(site, out)
}
