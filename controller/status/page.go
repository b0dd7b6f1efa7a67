package status

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/shared/metal"
)

//go:embed templates/*.html
var templateFiles embed.FS

// PageSize is how many machines (or sites) one page lists.
const PageSize = 100

// Options configure the status pages.
type Options struct {
	Sites    Sites
	Machines Machines
	Now      func() time.Time
	// Prefix is where the pages are mounted ("/status").
	Prefix string
	// MaxStreams bounds the live-update streams open at once (default 64).
	MaxStreams int
	// UpdateEvery is the least time between two live updates of one stream (default 5 s: every update makes
	// the page fetch itself again).
	UpdateEvery time.Duration
	// Heartbeat is how often an idle stream says it is alive (default 15 s).
	Heartbeat time.Duration
	// BMCProtocol is how a site's edge drives BMCs: "auto" (Redfish when the BMC answers it, else IPMI),
	// "ipmi" or "redfish" (optional: auto).
	BMCProtocol func(site string) string
	// History bounds the fleet view's history (kept in memory from NewPages on).
	History HistoryOptions
}

// Pages serves the status pages.
type Pages struct {
	opts    Options
	history *History
	tmpl    *template.Template
	streams atomic.Int64
	// stopped is closed when Run ends: live streams end with it (an HTTP server's shutdown waits for them).
	stopped chan struct{}
}

// NewPages returns the status pages.
func NewPages(opts Options) (*Pages, error) {
	if opts.Sites == nil || opts.Machines == nil || opts.Now == nil {
		return nil, errors.New("status pages: sites, machines and a clock are needed")
	}

	if opts.Prefix == "" {
		opts.Prefix = "/status"
	}

	if opts.MaxStreams <= 0 {
		opts.MaxStreams = 64
	}

	if opts.UpdateEvery <= 0 {
		opts.UpdateEvery = 5 * time.Second
	}

	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 15 * time.Second
	}

	p := &Pages{opts: opts, stopped: make(chan struct{}), history: NewHistory(opts.History, opts.Now)}

	// the timelines say what booted and what failed as it happens
	if o, ok := opts.Machines.(interface {
		Observe(f func(machineID, site string, e timeline.Entry))
	}); ok {
		o.Observe(p.history.Observe)
	}

	tmpl, err := template.New("status").Funcs(template.FuncMap{
		"ago":    p.ago,
		"when":   func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"prefix": func() string { return opts.Prefix },
		"query":  query,
		"dash":   dash,
		"add":    func(a, b int) int { return a + b },
		"phases": func() []string { return append(lifecycle.Phases(), timeline.UnknownPhase) },
		"states": SiteStates,
		"short":  shortWaiting,
		"bmc":    p.bmcLine,
	}).ParseFS(templateFiles, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("status templates: %w", err)
	}

	p.tmpl = tmpl

	return p, nil
}

// Run samples the fleet for the fleet view until ctx is done, then ends every live-update stream, so that the
// HTTP server can shut down at once. It returns nil then.
func (p *Pages) Run(ctx context.Context) error {
	p.history.runSampler(ctx, p.opts.Sites, p.opts.Machines)
	close(p.stopped)

	return nil
}

// Register mounts the pages on mux.
func (p *Pages) Register(mux *http.ServeMux) {
	pre := p.opts.Prefix
	mux.HandleFunc("GET "+pre+"/{$}", p.sitesPage)
	mux.HandleFunc("GET "+pre+"/machines", p.machinesPage)
	mux.HandleFunc("GET "+pre+"/machines/{id}", p.machinePage)
	mux.HandleFunc("GET "+pre+"/events", p.events)
	mux.HandleFunc("GET "+pre, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, pre+"/", http.StatusFound)
	})
}

func (p *Pages) ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}

	return p.opts.Now().Sub(t).Truncate(time.Second).String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}

	return s
}

// query builds a page's query string from key, value pairs (empty values left out).
func query(kv ...any) template.URL {
	q := url.Values{}

	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		v := fmt.Sprint(kv[i+1])

		if v != "" && v != "0" {
			q.Set(k, v)
		}
	}

	if len(q) == 0 {
		return ""
	}

	return template.URL("?" + q.Encode()) // encoded: every value escaped by url.Values
}

// SiteRow is a site on the sites page.
type SiteRow struct {
	Site

	Machines int
	Phases   []PhaseCount
}

// PhaseCount is how many machines of a site are in a phase.
type PhaseCount struct {
	Phase string
	Count int
}

// Pager is where a list is.
type Pager struct {
	Page, Pages, Total int
}

type sitesData struct {
	// State is the link state shown ("": all).
	State string
	Sites []SiteRow
	Pager
	Connected, Offline int
	Machines           int
	Fleet              Fleet
}

type machinesData struct {
	Filter   timeline.Filter
	Machines []MachineRow
	Pager
}

// MachineRow is a machine on the machine list, with what it is doing now.
type MachineRow struct {
	timeline.Machine

	Now Now
}

type machineData struct {
	Record timeline.Record
	// Diagnosis says where the machine's current boot stopped ("" when nothing is amiss).
	Diagnosis string
	// Now is its current problem or last event, in one line.
	Now Now
}

// SiteStates are the states a site's link can be in.
func SiteStates() []string { return []string{"connected", "offline", "revoked", "awaiting-enrolment"} }

// SitesPage renders page n of the sites in state ("": all) to a buffer (the handler's work, also measured by
// benchmarks).
func (p *Pages) SitesPage(ctx context.Context, state string, page int) (*bytes.Buffer, error) {
	all, err := p.opts.Sites.Sites(ctx)
	if err != nil {
		return nil, err
	}

	byPhase := p.opts.Machines.Phases()

	slices.SortFunc(all, func(a, b Site) int { return strings.Compare(a.ID, b.ID) })

	data := sitesData{State: state}
	sites := all[:0:0]

	for _, s := range all {
		if s.State == "connected" {
			data.Connected++
		} else {
			data.Offline++
		}

		if state == "" || s.State == state {
			sites = append(sites, s)
		}
	}

	data.Pager = pager(page, len(sites))

	for _, n := range byPhase {
		for _, c := range n {
			data.Machines += c
		}
	}

	from, to := window(data.Pager, len(sites))
	for _, s := range sites[from:to] {
		row := SiteRow{Site: s}

		for _, ph := range append(lifecycle.Phases(), timeline.UnknownPhase) {
			if n := byPhase[s.ID][ph]; n > 0 {
				row.Phases = append(row.Phases, PhaseCount{Phase: ph, Count: n})
				row.Machines += n
			}
		}

		data.Sites = append(data.Sites, row)
	}

	data.Fleet = fleetView(p.history, sampleOf(all, byPhase, p.opts.Now()))

	return p.render("sites.html", data)
}

// MachinesPage renders a page of the machine list selected by q.
func (p *Pages) MachinesPage(ctx context.Context, q PageQuery) (*bytes.Buffer, error) {
	list, total := p.opts.Machines.List(q.Filter, (q.Page-1)*PageSize, PageSize)

	pg := pager(q.Page, total)
	if pg.Page != q.Page { // past the end: the last page
		list, total = p.opts.Machines.List(q.Filter, (pg.Page-1)*PageSize, PageSize)
		pg.Total = total
	}

	states := p.siteStates(ctx)
	rows := make([]MachineRow, 0, len(list))

	for _, m := range list {
		rec, ok := p.opts.Machines.Get(m.ID)
		if !ok {
			rec = timeline.Record{Machine: m}
		}

		rows = append(rows, MachineRow{Machine: m, Now: Summarize(rec, states[m.Site])})
	}

	return p.render("machines.html", machinesData{Filter: q.Filter, Machines: rows, Pager: pg})
}

// siteStates is each site's link state (none when the sites cannot be read: no error is then cleared).
func (p *Pages) siteStates(ctx context.Context) map[string]string {
	out := map[string]string{}

	if all, err := p.opts.Sites.Sites(ctx); err == nil {
		for _, s := range all {
			out[s.ID] = s.State
		}
	}

	return out
}

func pager(page, total int) Pager {
	pages := max(1, (total+PageSize-1)/PageSize)

	return Pager{Page: min(max(page, 1), pages), Pages: pages, Total: total}
}

func window(pg Pager, n int) (from, to int) {
	from = min((pg.Page-1)*PageSize, n)

	return from, min(from+PageSize, n)
}

func (p *Pages) render(name string, data any) (*bytes.Buffer, error) {
	var buf bytes.Buffer
	if err := p.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}

	return &buf, nil
}

func (p *Pages) sitesPage(w http.ResponseWriter, r *http.Request) {
	page := 1

	state := r.URL.Query().Get("state")
	if state != "" && !slices.Contains(SiteStates(), state) {
		http.Error(w, fmt.Sprintf("state must be one of %v", SiteStates()), http.StatusBadRequest)

		return
	}

	if s := r.URL.Query().Get("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageNumber {
			http.Error(w, "page must be a positive number", http.StatusBadRequest)

			return
		}

		page = n
	}

	buf, err := p.SitesPage(r.Context(), state, page)
	p.write(w, buf, err)
}

func (p *Pages) machinesPage(w http.ResponseWriter, r *http.Request) {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		// plain text, and escaped anyway: the message quotes what the client sent
		http.Error(w, template.HTMLEscapeString(err.Error()), http.StatusBadRequest)

		return
	}

	buf, err := p.MachinesPage(r.Context(), q)
	p.write(w, buf, err)
}

func (p *Pages) machinePage(w http.ResponseWriter, r *http.Request) {
	id, err := metal.ParsePeerID(r.PathValue("id"))

	rec, ok := p.opts.Machines.Get(id)
	if err != nil || !ok {
		http.Error(w, "no such machine", http.StatusNotFound)

		return
	}

	buf, err := p.render("machine.html", machineData{
		Record: rec, Diagnosis: timeline.Diagnose(rec, p.opts.Now()), Now: Summarize(rec, p.siteStates(r.Context())[rec.Site]),
	})
	p.write(w, buf, err)
}

func (p *Pages) write(w http.ResponseWriter, buf *bytes.Buffer, err error) {
	if err != nil {
		http.Error(w, "cannot render the page: "+err.Error(), http.StatusInternalServerError)

		return
	}

	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// only this page's own script and styles; nothing from elsewhere, no framing
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.Write(buf.Bytes()) //nolint:errcheck
}

// events streams server-sent events: "changed" when any machine changed (at most every UpdateEvery), a
// comment as heartbeat. The page's script then fetches itself again.
func (p *Pages) events(w http.ResponseWriter, r *http.Request) {
	if p.streams.Add(1) > int64(p.opts.MaxStreams) {
		p.streams.Add(-1)
		http.Error(w, "too many live views open", http.StatusServiceUnavailable)

		return
	}
	defer p.streams.Add(-1)

	rc := http.NewResponseController(w)

	// a stream outlives the server's write timeout; it ends with the client or the server
	if err := rc.SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)

	if _, err := fmt.Fprint(w, "retry: 5000\n\n"); err != nil || rc.Flush() != nil {
		return
	}

	heartbeat := time.NewTicker(p.opts.Heartbeat)
	defer heartbeat.Stop()

	for {
		changed := p.opts.Machines.Changed()

		select {
		case <-r.Context().Done():
			return
		case <-p.stopped:
			return
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}

			continue
		case <-changed:
		}

		if _, err := fmt.Fprint(w, "data: changed\n\n"); err != nil || rc.Flush() != nil {
			return
		}

		select {
		case <-r.Context().Done():
			return
		case <-p.stopped:
			return
		case <-time.After(p.opts.UpdateEvery):
		}
	}
}
