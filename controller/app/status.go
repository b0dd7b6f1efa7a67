package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/cosi-project/runtime/pkg/state"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/controller/status"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

// newStatus builds what an operator sees: every machine's timeline (fed by the edges' events through the
// receiver and by the lifecycle's journal, kept in Omni by the Omni session), the status pages on the HTTP
// listener, behind a token and TLS when it is off loopback, and the Machines admin API.
func (b *builder) newStatus(context.Context) error {
	access := status.Access{TokenFile: b.cfg.HTTPTokenFile, CertFile: b.cfg.HTTPCertFile, KeyFile: b.cfg.HTTPKeyFile}

	if b.cfg.HTTPListen != "" {
		if err := access.Check(b.cfg.HTTPListen); err != nil {
			return err
		}
	}

	token, err := access.Token()
	if err != nil {
		return err
	}

	book := b.timelines // built with the edge wiring, whose receiver hands it the edges' events
	b.lifecycleDeps.Journal = book

	pages, err := status.NewPages(status.Options{
		Sites:    registrySites{registry: b.registry, uplink: b.uplink, store: b.store, catalog: b.assets.catalog},
		Machines: book,
		Now:      time.Now,
		BMCProtocol: func(site string) string {
			return machines.BMCProtocolName(b.edges.policies.BMCProtocol(site, b.edges.bmcProtocol))
		},
	})
	if err != nil {
		return err
	}

	pages.Register(b.mux)
	b.run("status streams", pages.Run)
	apiOpts := []status.APIOption{status.WithLocations(b.edges.locations), status.WithSitePolicies(b.edges.policies)}
	if b.elector != nil {
		apiOpts = append(apiOpts, status.WithRole(b.elector))
	}

	adminpb.RegisterMachinesServer(b.admin, status.NewAPI(book, apiOpts...))

	guard := status.NewGuard(token, b.mux)
	if err := registerAll(b.metrics, book, guard); err != nil {
		return err
	}

	b.httpAccess = func(ln net.Listener) (net.Listener, http.Handler, error) {
		tln, err := access.Listen(ln)
		if err != nil {
			return nil, nil, err
		}

		return tln, guard, nil
	}

	return nil
}

// registrySites is the status pages' view of the sites: the registry, each link's state and edge version as
// the uplink server recorded it, and each site's boot assets as the catalog knows them.
type registrySites struct {
	registry *sites.Registry
	uplink   *sites.Server
	store    state.State
	catalog  *assets.Catalog
}

// Sites implements status.Sites.
func (r registrySites) Sites(ctx context.Context) ([]status.Site, error) {
	list, err := r.registry.List(ctx)
	if err != nil {
		return nil, err
	}

	out := make([]status.Site, 0, len(list))

	for _, site := range list {
		id, spec := site.Metadata().ID(), site.TypedSpec().Value

		st, err := sites.Status(ctx, r.store, id)
		if err != nil {
			return nil, fmt.Errorf("status of site %s: %w", id, err)
		}

		live := st.TypedSpec().Value
		s := status.Site{ID: id, Description: spec.GetDescription(), EdgeVersion: live.GetEdgeVersion(), Boots: status.BootsBy(spec.GetDhcpMode())}

		switch {
		case spec.GetRevoked():
			s.State = "revoked"
		case r.uplink.Connected(id):
			s.State = "connected"
		case len(spec.GetCertificateSerials()) > 0:
			s.State = "offline"
		default:
			s.State = "awaiting-enrolment"
		}

		if ts := live.GetLastSeen(); ts.IsValid() {
			s.LastSeen = ts.AsTime()
		}

		if a := r.catalog.Site(id); !a.ReportedAt.IsZero() {
			s.AssetsKnown, s.AssetsCached, s.AssetsMissing = true, len(a.Cached), len(a.Missing)
		}

		out = append(out, s)
	}

	return out, nil
}
