package lab_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/qemu/lab"
)

const (
	pageM1 = "0e5a1ab0-0000-4000-8000-000000000101"
	pageM2 = "0e5a1ab0-0000-4000-8000-000000000102"
)

type pageSites []status.Site

func (s pageSites) Sites(_ context.Context) ([]status.Site, error) { return s, nil }

// statusServer serves the controller's real status pages for two machines at site-1 (one with its boot steps
// in order, one whose wipe is recorded before its agent came up) and an offline site-2.
func statusServer(t *testing.T) *httptest.Server {
	t.Helper()

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	book.Summarize(pageM1, lifecycle.MachineSummary{Site: "site-1", Phase: lifecycle.PhaseReady, Power: "on", Waiting: "kept on by Omni"})
	book.Summarize(pageM2, lifecycle.MachineSummary{Site: "site-1", Phase: lifecycle.PhaseWiping, Power: "on"})

	for _, k := range []string{timeline.KindBootServed, timeline.KindAgentUp, timeline.KindWipeStarted, timeline.KindWipeFinished} {
		book.Record(pageM1, k, "step "+k, false)
	}

	for _, k := range []string{timeline.KindBootServed, timeline.KindWipeStarted, timeline.KindAgentUp, timeline.KindWipeFinished} {
		book.Record(pageM2, k, "step "+k, false)
	}

	pages, err := status.NewPages(status.Options{
		Sites: pageSites{
			{ID: "site-1", State: "connected", Description: "lab site-1", LastSeen: time.Now(), Boots: status.BootsBy("off")},
			{ID: "site-2", State: "offline", Boots: status.BootsBy("")},
		},
		Machines: book, Now: time.Now,
	})
	require.NoError(t, err)

	mux := http.NewServeMux()
	pages.Register(mux)

	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	return srv
}

func fetch(t *testing.T, url string) []byte {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	require.Equal(t, http.StatusOK, resp.StatusCode)

	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return b
}

// The parsers read what the controller's own templates render.
func TestParseStatusPages(t *testing.T) {
	t.Parallel()

	srv := statusServer(t)

	sites, err := lab.ParseSitesPage(fetch(t, srv.URL+"/status/"))
	require.NoError(t, err)
	require.Equal(t, []lab.PageSite{
		{ID: "site-1", State: "connected", Boots: status.BootsBy("off"), Phases: map[string]int{lifecycle.PhaseReady: 1, lifecycle.PhaseWiping: 1}},
		{ID: "site-2", State: "offline", Boots: status.BootsBy(""), Phases: map[string]int{}},
	}, sites)

	list, err := lab.ParseMachinesPage(fetch(t, srv.URL+"/status/machines"))
	require.NoError(t, err)
	require.ElementsMatch(t, []lab.PageMachine{
		{ID: pageM1, Site: "site-1", Phase: lifecycle.PhaseReady},
		{ID: pageM2, Site: "site-1", Phase: lifecycle.PhaseWiping},
	}, list)

	m, entries, err := lab.ParseMachinePage(fetch(t, srv.URL+"/status/machines/"+pageM1))
	require.NoError(t, err)
	require.Equal(t, lab.PageMachine{ID: pageM1, Site: "site-1", Phase: lifecycle.PhaseReady}, m)
	require.NoError(t, lab.CheckBootOrder(entries))

	_, entries, err = lab.ParseMachinePage(fetch(t, srv.URL+"/status/machines/"+pageM2))
	require.NoError(t, err)
	require.ErrorContains(t, lab.CheckBootOrder(entries), "lists wipe-started (row 3) before agent-up (row 4)")

	require.ErrorContains(t, lab.CheckBootOrder(entries[:2]), "no agent-up entry")
}

func TestParseStatusPagesRefuse(t *testing.T) {
	t.Parallel()

	_, err := lab.ParseSitesPage([]byte("<html><body><p>no main</p></body></html>"))
	require.ErrorContains(t, err, `no element with id "main"`)

	_, err = lab.ParseSitesPage([]byte(`<main id="main"><table><tr><td>a</td><td>connected</td><td></td><td></td><td></td><td></td>` +
		`<td><a>ready: many</a></td></tr></table></main>`))
	require.ErrorContains(t, err, "bad count")

	_, _, err = lab.ParseMachinePage([]byte(`<main id="main"><h1>Machine</h1></main>`))
	require.ErrorContains(t, err, "without a machine ID")

	_, err = lab.ParseMachinesPage([]byte(`<main id="main"><table>` + strings.Repeat("<tr><td>x</td></tr>", 10001) + `</table></main>`))
	require.ErrorContains(t, err, "over 10000 table rows")
}

// The parsers read a browser's DOM dump: whatever it holds, they return an error or rows, never panic.
func FuzzParseStatusPages(f *testing.F) {
	f.Add([]byte(`<main id="main"><h1>Machine <code>x</code></h1><table><tr><th>Site</th><td>s</td></tr>` +
		`<tr><td>t</td><td>agent-up</td><td>x</td></tr></table></main>`))
	f.Add([]byte(`<main id="main"><table><tr><td>a</td><td>b</td><td>c</td><td>d</td><td>e</td><td>f</td><td><a>ready: 1</a><a>x</a></td></tr></table></main>`))
	f.Add([]byte("<tr><td>"))
	f.Add([]byte(`<figure data-plot="plot-boots" data-points="2"><svg><rect class="bar" fill="#1f77b4"/></svg></figure>`))

	f.Fuzz(func(t *testing.T, dom []byte) {
		if _, err := lab.ParseSitesPage(dom); err == nil {
			_, _ = lab.ParseMachinesPage(dom)
		}

		if _, entries, err := lab.ParseMachinePage(dom); err == nil {
			_ = lab.CheckBootOrder(entries)
		}

		_, _ = lab.CheckFleetView(dom, lab.FleetPlots...)
		_, _ = lab.ParseMachinesNow(dom)
	})
}

// Without Chromium the lab says why (the scenario's step is then skipped with that reason, not failed).
func TestFindChromiumMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())

	_, err := lab.FindChromium()
	require.ErrorContains(t, err, "no chromium binary in PATH")
}
