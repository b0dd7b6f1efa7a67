package sites

import (
	"sync"
	"time"

	"go.uber.org/zap"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/version"
)

// maxRefusals bounds the refusals kept for `site list`: one per site, and sites are bounded by the registry,
// but a site deleted while refused would otherwise stay.
const maxRefusals = 4096

// checkRelease holds an authenticated hello's edge release to this controller's (version.CheckEdge) and
// remembers a refusal for the site's views until the site next connects.
func (s *Server) checkRelease(hello *uplinkpb.Hello, log *zap.Logger) *rejection {
	skew, err := version.CheckEdge(s.opts.Version, hello.GetEdgeVersion())
	if err != nil {
		s.refusals.put(hello.GetSiteId(), releaseRefusal{reason: err.Error(), at: s.opts.Now()})

		return &rejection{code: uplinkpb.HelloReply_CODE_EDGE_VERSION, reason: err.Error(), metric: reasonEdgeVersion, reply: true}
	}

	switch skew {
	case version.SkewOneBehind:
		log.Info("edge one release behind accepted", zap.String("site", hello.GetSiteId()),
			zap.String("edge_version", hello.GetEdgeVersion()), zap.String("controller_version", s.opts.Version))
	case version.SkewUnchecked:
		log.Info("edge release not checked: a development build is on no release line", zap.String("site", hello.GetSiteId()),
			zap.String("edge_version", hello.GetEdgeVersion()), zap.String("controller_version", s.opts.Version))
	case version.SkewSame:
	}

	return nil
}

// EdgeRefused returns why the site's edge was last refused for its release, and when; empty when it was not,
// or when the site has connected since.
func (s *Server) EdgeRefused(siteID string) (string, time.Time) {
	r := s.refusals.get(siteID)

	return r.reason, r.at
}

type releaseRefusal struct {
	reason string
	at     time.Time
}

// releaseRefusals holds the last release refusal per site.
type releaseRefusals struct {
	mu     sync.Mutex
	bySite map[string]releaseRefusal
}

func (t *releaseRefusals) put(siteID string, r releaseRefusal) {
	t.mu.Lock()
	defer t.mu.Unlock()

	if t.bySite == nil {
		t.bySite = map[string]releaseRefusal{}
	}

	if _, ok := t.bySite[siteID]; !ok && len(t.bySite) >= maxRefusals {
		for id := range t.bySite {
			delete(t.bySite, id)

			break
		}
	}

	t.bySite[siteID] = r
}

func (t *releaseRefusals) get(siteID string) releaseRefusal {
	t.mu.Lock()
	defer t.mu.Unlock()

	return t.bySite[siteID]
}

func (t *releaseRefusals) clear(siteID string) {
	t.mu.Lock()
	defer t.mu.Unlock()

	delete(t.bySite, siteID)
}
