package httpd

import (
	"bytes"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/bootfiles"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

func (s *Server) serveInit(w http.ResponseWriter, r *http.Request) {
	base, ok := baseURL(s.cfg, r.Host)
	if !ok {
		s.reject(w, ReasonBadHost, http.StatusBadRequest, nil)

		return
	}

	writeText(w, "text/plain; charset=utf-8", renderInit(base, s.cfg.Retries))
}

func (s *Server) serveProbe(w http.ResponseWriter, _ *http.Request) {
	writeText(w, "text/plain; charset=utf-8", []byte(probeScript))
}

// serveBoot gathers what Decide needs, reports the boot, writes its answer and counts it.
func (s *Server) serveBoot(w http.ResponseWriter, r *http.Request) {
	q, err := ParseBootQuery(r.URL.RawQuery)
	if err != nil {
		s.reject(w, ReasonBadQuery, http.StatusBadRequest, err)

		return
	}

	now := s.deps.Now()
	waitKey := q.UUID.String() + "|" + q.MAC.String()
	e := s.deps.Table.Lookup(q.UUID, q.MAC, q.Arch())

	a := Decide(s.cfg, Request{
		Query: q, Host: r.Host, Plan: e, Assets: s.deps.Assets, Coming: s.deps.Coming, Upstream: s.upstream(),
		LastReported: s.waits.last(waitKey), Now: now,
	})

	// Reported before the answer is written: the machine's agent may dial the moment it has its script, and
	// the served boot is the evidence its tunnel is bound to.
	if s.deps.Observer != nil && a.Mode != "" && a.Report {
		s.deps.Observer.BootServed(BootServed{
			UUID: q.UUID, MAC: q.MAC, Build: q.Build, Platform: q.Platform, Mode: a.Mode, Remote: remoteAddr(r), TableVersion: e.Version,
			Missing: a.Missing, WaitingFor: a.Waiting,
		})
	}

	switch {
	case a.Mode == "":
		if a.Reason == ReasonNoArchAssets {
			s.log.Warn("boot refused: the site has no agent assets for the machine's arch", zap.Stringer("uuid", q.UUID),
				zap.Stringer("mac", q.MAC), zap.String("arch", string(q.Arch())), zap.String("reason", string(a.Reason)))
		}

		s.reject(w, a.Reason, a.Status, nil)

		return
	case a.Kind == KindRefuse:
		if a.Reason != ReasonDenied && a.Reason != ReasonDiskByHTTP404 {
			s.metrics.rejected.WithLabelValues(string(a.Reason)).Inc()
			s.log.Warn("boot plan not rendered", zap.Stringer("uuid", e.UUID), zap.String("reason", string(a.Reason)))
		}

		// The chain fails and the firmware moves on.
		http.Error(w, "no boot for this machine", a.Status)
	default:
		writeText(w, "text/plain; charset=utf-8", a.Script())
	}

	s.metrics.served.WithLabelValues(string(a.Mode)).Inc()

	if a.Kind == KindWait && a.Report {
		s.waits.note(waitKey, now)
		s.log.Warn("boot waits for assets the site does not hold", zap.String("mode", string(a.Waiting)), zap.Stringer("uuid", e.UUID),
			zap.Strings("missing", a.Missing))
	}
}

func (s *Server) serveBinary(w http.ResponseWriter, r *http.Request) {
	f, err := s.deps.Catalog.Lookup(r.PathValue("file"))
	if err != nil {
		reason := ReasonNotFound
		if errors.Is(err, bootfiles.ErrBadName) {
			reason = ReasonBadName
		}

		s.reject(w, reason, http.StatusNotFound, err)

		return
	}

	w.Header().Set("ETag", `"`+f.SHA256+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, f.Name, f.ModTime, f.Reader())

	if s.deps.Observer != nil && r.Method == http.MethodGet {
		s.deps.Observer.HTTPFetch(bootfiles.Fetch{Name: f.Name, Remote: remoteAddr(r)})
	}
}

func (s *Server) serveConfig(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("u")
	if len(u) > 64 {
		s.reject(w, ReasonBadQuery, http.StatusBadRequest, nil)

		return
	}

	cfg := s.deps.Table.MachineConfig(u)
	if cfg == nil {
		http.Error(w, "no machine config from the controller yet", http.StatusServiceUnavailable)

		return
	}

	if mirror := s.installerMirror(u, r.Host); mirror != nil {
		cfg = append(append(bytes.TrimRight(slices.Clone(cfg), "\n"), "\n---\n"...), mirror...)
	}

	// Nothing is reported: the request carries no MAC and any host may send it, so it is no evidence of a
	// machine's boot (edge/tunnel.BootBook binds agent tunnels to the boot scripts served).
	writeText(w, "application/yaml", cfg)
}

// writeText sends a complete small response with Content-Length and flushes it, so the client has it
// before the handler does anything else.
func writeText(w http.ResponseWriter, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)                      //nolint:errcheck // the client went away: nothing to do
	_ = http.NewResponseController(w).Flush() //nolint:errcheck
}

// upstream is the site's rule for upstream install assets now.
func (s *Server) upstream() UpstreamRule {
	if s.deps.Upstream == nil {
		return UpstreamAllowed
	}

	return s.deps.Upstream()
}

// installerMirror is the registry mirror document a machine in install mode gets with its config at a site
// whose machines pull the installer image through the edge (nil: none).
func (s *Server) installerMirror(uuid, host string) []byte {
	rule := s.upstream()
	if rule == UpstreamAllowed {
		return nil
	}

	e := s.deps.Table.Lookup(metal.ID(metal.NormalizeID(uuid)), nil, "")
	if e.Mode != bootpb.Mode_MODE_INSTALL || e.Install.GetInstaller() == "" {
		return nil
	}

	base, ok := baseURL(s.cfg, host)
	if !ok {
		return nil
	}

	doc, err := registryMirror(e.Install.GetInstaller(), base, rule)
	if err != nil {
		s.log.Warn("no registry mirror for the installer image", zap.String("uuid", uuid), zap.Error(err))

		return nil
	}

	return doc
}

func (s *Server) reject(w http.ResponseWriter, reason Reason, code int, err error) {
	s.metrics.rejected.WithLabelValues(string(reason)).Inc()
	s.log.Debug("http request refused", zap.String("reason", string(reason)), zap.Error(err))
	http.Error(w, http.StatusText(code), code)
}

func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}

	return ap.Addr().Unmap()
}

// waitReports remembers when each waiting machine was last reported (bounded: old entries go first).
type waitReports struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// last returns when key was last reported (zero if never, or forgotten).
func (w *waitReports) last(key string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()

	return w.seen[key]
}

// note records that key was reported at now.
func (w *waitReports) note(key string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()

	if w.seen == nil || len(w.seen) >= 4096 {
		for k, t := range w.seen {
			if now.Sub(t) >= WaitReportEvery {
				delete(w.seen, k)
			}
		}

		if w.seen == nil || len(w.seen) >= 4096 {
			w.seen = map[string]time.Time{}
		}
	}

	w.seen[key] = now
}
