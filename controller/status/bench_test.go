package status_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
)

// fleet generates 500 sites of 40 machines each (20,000), every machine with a full timeline.
func fleet(b *testing.B) (siteList, *timeline.Book) {
	b.Helper()

	now := time.Now()
	book := timeline.New(timeline.DefaultConfig(), func() time.Time { return now })
	sites := make(siteList, 0, 500)

	for s := range 500 {
		site := fmt.Sprintf("site-%03d", s)
		state := "connected"

		if s%50 == 0 {
			state = "offline"
		}

		sites = append(sites, status.Site{ID: site, State: state, EdgeVersion: "v0.9.0", LastSeen: now, AssetsKnown: true, AssetsCached: 4})

		for m := range 40 {
			id := fmt.Sprintf("%08x-0000-4000-8000-%012x", s, m)
			book.Summarize(id, lifecycle.MachineSummary{
				Site: site, Phase: lifecycle.Phases()[(s+m)%len(lifecycle.Phases())], Power: "on", BMCAddress: "10.0.0.1", BMCProtocol: "ipmi",
			})

			for i := range 64 {
				book.Record(id, timeline.KindLifecycle, fmt.Sprintf("step %d", i), false)
			}
		}
	}

	return sites, book
}

func pages(b *testing.B, sites siteList, book *timeline.Book) *status.Pages {
	b.Helper()

	p, err := status.NewPages(status.Options{Sites: sites, Machines: book, Now: time.Now})
	if err != nil {
		b.Fatal(err)
	}

	return p
}

// BenchmarkSitesPage renders the first sites page (100 of 500 sites, each with its machines by phase) over
// a fleet of 20,000 machines.
func BenchmarkSitesPage(b *testing.B) {
	sites, book := fleet(b)
	p := pages(b, sites, book)

	b.ReportAllocs()
	b.ResetTimer()

	for b.Loop() {
		if _, err := p.SitesPage(b.Context(), "", 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMachineListFiltered renders a page of machines in one phase over all 20,000 (the heaviest
// filter: every site's machines are looked at and ordered), and a site's machines in one phase.
func BenchmarkMachineListFiltered(b *testing.B) {
	sites, book := fleet(b)
	p := pages(b, sites, book)

	for name, f := range map[string]timeline.Filter{
		"phase":      {Phase: lifecycle.PhaseReady},
		"site+phase": {Site: "site-123", Phase: lifecycle.PhaseReady},
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()

			for b.Loop() {
				if _, err := p.MachinesPage(b.Context(), status.PageQuery{Filter: f, Page: 3}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
