package status_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

const m1 = "4c4c4544-0042-3510-8052-b4c04f4e3232"

// siteList is a fixed list of sites.
type siteList []status.Site

func (s siteList) Sites(context.Context) ([]status.Site, error) {
	return append([]status.Site(nil), s...), nil
}

const hostile = `<script>alert(1)</script>"'&`

func hostileFleet(t *testing.T) (siteList, *timeline.Book) {
	t.Helper()

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	book.Summarize(m1, lifecycle.MachineSummary{
		Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "unknown", BMCAddress: hostile, BMCProtocol: "ipmi", Waiting: "power state unknown: " + hostile,
	})
	require.NoError(t, book.HandleEvent(t.Context(), "branch-7", &bootpb.Event{Kind: &bootpb.Event_PowerChanged{
		PowerChanged: &bootpb.PowerChanged{MachineId: m1, State: "unknown", Error: hostile},
	}}))

	return siteList{{ID: "branch-7", State: "connected", EdgeVersion: "v1" + hostile, Description: hostile, LastSeen: time.Now()}}, book
}

func newServer(t *testing.T, sites status.Sites, book *timeline.Book, token []byte) *httptest.Server {
	t.Helper()

	srv, _ := newStoppableServer(t, sites, book, token)

	return srv
}

// newStoppableServer also returns the stop of the pages' Run.
func newStoppableServer(t *testing.T, sites status.Sites, book *timeline.Book, token []byte) (*httptest.Server, context.CancelFunc) {
	t.Helper()

	pages, err := status.NewPages(status.Options{Sites: sites, Machines: book, Now: time.Now, UpdateEvery: time.Millisecond})
	require.NoError(t, err)

	ctx, stop := context.WithCancel(t.Context())

	ran := make(chan error, 1)

	go func() { ran <- pages.Run(ctx) }()

	t.Cleanup(func() {
		stop()
		require.NoError(t, <-ran)
	})

	mux := http.NewServeMux()
	pages.Register(mux)

	srv := httptest.NewServer(status.NewGuard(token, mux))
	t.Cleanup(srv.Close)

	return srv, stop
}

func get(t *testing.T, url string, header ...string) (int, string) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)

	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close()

	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return resp.StatusCode, string(body)
}

// What edges, BMCs and operators supply (versions, errors, addresses, descriptions) is escaped on every page.
func TestPagesEscapeHostileStrings(t *testing.T) {
	t.Parallel()

	sites, book := hostileFleet(t)
	srv := newServer(t, sites, book, nil)

	for _, path := range []string{"/status/", "/status/machines", "/status/machines?site=branch-7", "/status/machines/" + m1} {
		code, body := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<script>alert", path)
		require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", path)
	}

	_, body := get(t, srv.URL+"/status/machines/"+m1)
	require.Contains(t, body, "BMC not answering")
	require.Contains(t, body, "Redfish where the BMC answers it, else IPMI (auto)", "under auto, no protocol is claimed that the edge may not use")
	require.NotContains(t, body, "Boot stopped", "no power-on in the timeline: nothing to diagnose")

	// A boot whose agent tunnel was refused says so at the top of the machine's page, escaped.
	book.Record(m1, timeline.KindPower, "powered on into agent mode", false)
	book.Record(m1, timeline.KindError, "agent tunnel from 10.0.0.9 refused: "+hostile, true)

	_, body = get(t, srv.URL+"/status/machines/"+m1)
	require.Contains(t, body, "Boot stopped:</strong> its agent&#39;s tunnel was refused at")
	require.NotContains(t, body, "<script>alert")
}

func TestSitesPageCountsPhases(t *testing.T) {
	t.Parallel()

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	for i := range 5 {
		phase := lifecycle.PhaseInstalled
		if i < 2 {
			phase = lifecycle.PhaseWiping
		}

		book.Summarize(fmt.Sprintf("00000000-0000-0000-0000-%012d", i), lifecycle.MachineSummary{Site: "a", Phase: phase})
	}

	srv := newServer(t, siteList{{ID: "a", State: "connected"}, {ID: "b", State: "offline", AssetsKnown: true, AssetsMissing: 2}}, book, nil)

	code, body := get(t, srv.URL+"/status/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "wiping: 2")
	require.Contains(t, body, "installed: 3")
	require.Contains(t, body, "Sites: 1 connected, 1 not; 5 machines")
	require.Contains(t, body, `href="/status/machines?phase=wiping&amp;site=a"`)

	code, body = get(t, srv.URL+"/status/?state=offline")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="/status/machines?site=b"`)
	require.NotContains(t, body, `href="/status/machines?site=a"`)

	code, body = get(t, srv.URL+"/status/machines?site=a&phase=wiping")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "2 machines")
	require.NotContains(t, body, "00000000-0000-0000-0000-000000000004")
}

func TestBadQueriesRefused(t *testing.T) {
	t.Parallel()

	sites, book := hostileFleet(t)
	srv := newServer(t, sites, book, nil)

	for name, path := range map[string]string{
		"phase":       "/status/machines?phase=" + url.QueryEscape(hostile),
		"site":        "/status/machines?site=" + url.QueryEscape("../x"),
		"page":        "/status/machines?page=-1",
		"huge page":   "/status/machines?page=99999999999999999999",
		"sites page":  "/status/?page=x",
		"site state":  "/status/?state=" + url.QueryEscape(hostile),
		"unknown one": "/status/machines/" + strings.Repeat("a", 36),
	} {
		code, body := get(t, srv.URL+path)
		require.NotEqual(t, http.StatusOK, code, name)
		require.NotContains(t, body, "<script>", name)
	}
}

// With a token, every request without it is refused with 401; with it (header or the login cookie) served.
func TestTokenRequired(t *testing.T) {
	t.Parallel()

	sites, book := hostileFleet(t)
	token := []byte("0123456789abcdef-secret")
	srv := newServer(t, sites, book, token)

	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "Basic " + string(token)}, {"Cookie", "outpost_status=nope"}} {
		code, body := get(t, srv.URL+"/status/", h...)
		require.Equal(t, http.StatusUnauthorized, code, h)
		require.NotContains(t, body, "branch-7")
	}

	code, _ := get(t, srv.URL+status.HealthPath)
	require.Equal(t, http.StatusNotFound, code, "the health check passes the guard (not mounted here)")

	code, body := get(t, srv.URL+"/status/", "Authorization", "Bearer "+string(token))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "branch-7")

	// a browser logs in: the token comes back as a secure, HTTP-only cookie
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := client.PostForm(srv.URL+status.LoginPath, url.Values{"token": {"wrong"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	resp, err = client.PostForm(srv.URL+status.LoginPath, url.Values{"token": {string(token)}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)

	cookies := resp.Cookies()
	require.Len(t, cookies, 1)
	require.True(t, cookies[0].HttpOnly)
	require.True(t, cookies[0].Secure)

	code, _ = get(t, srv.URL+"/status/", "Cookie", cookies[0].Name+"="+cookies[0].Value)
	require.Equal(t, http.StatusOK, code)
}

// The live view says "changed" when a machine changes.
func TestEventsStreamChanges(t *testing.T) {
	t.Parallel()

	sites, book := hostileFleet(t)
	srv := newServer(t, sites, book, nil)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/status/events", nil)
	require.NoError(t, err)

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close()

	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	lines := bufio.NewScanner(resp.Body)
	require.True(t, lines.Scan())
	require.Equal(t, "retry: 5000", lines.Text())

	book.Record(m1, timeline.KindLifecycle, "something happened", false)

	for lines.Scan() {
		if lines.Text() == "data: changed" {
			return
		}
	}

	t.Fatalf("no change event: %v", lines.Err())
}

func TestAccessCheck(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct {
		addr string
		acc  status.Access
		ok   bool
	}{
		"loopback v4":           {"127.0.0.1:9090", status.Access{}, true},
		"loopback v6":           {"[::1]:9090", status.Access{}, true},
		"localhost":             {"localhost:9090", status.Access{}, true},
		"all interfaces":        {":9090", status.Access{}, false},
		"off loopback no tls":   {"10.0.0.1:9090", status.Access{TokenFile: "t"}, false},
		"off loopback no token": {"10.0.0.1:9090", status.Access{CertFile: "c", KeyFile: "k"}, false},
		"off loopback complete": {"0.0.0.0:9090", status.Access{TokenFile: "t", CertFile: "c", KeyFile: "k"}, true},
		"cert without key":      {"127.0.0.1:9090", status.Access{CertFile: "c"}, false},
	} {
		err := tc.acc.Check(tc.addr)
		if tc.ok {
			require.NoError(t, err, name)
		} else {
			require.Error(t, err, name)
		}
	}
}

// A live stream ends when the pages stop (the HTTP server's shutdown does not wait for its clients).
func TestEventsEndWithRun(t *testing.T) {
	t.Parallel()

	sites, book := hostileFleet(t)
	srv, stop := newStoppableServer(t, sites, book, nil)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/status/events", nil)
	require.NoError(t, err)

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close()

	stop()

	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err, "the stream ended from the server's side, before the client's deadline")
	require.NoError(t, ctx.Err())
}

// A machine whose inventory was read is named by its hardware beside its UUID, and under the auto protocol its
// page says which protocol the edge settled on; the BMC's words are escaped (terminal codes shown, HTML inert).
func TestPagesNameHardwareAndProtocol(t *testing.T) {
	t.Parallel()

	const m2 = "4c4c4544-0042-3510-8052-b4c04f4e3233"

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	book.Summarize(m1, lifecycle.MachineSummary{
		Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "on", BMCAddress: "10.0.0.9:623", BMCProtocol: "ipmi",
		Hardware: "Dell Inc. PowerEdge R640, 2 CPUs, 384 GiB", DrivenOver: "ipmi",
	})
	book.Summarize(m2, lifecycle.MachineSummary{
		Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "on", BMCAddress: "10.0.0.10:623", BMCProtocol: "ipmi",
		Hardware: "\x1b[2J" + hostile, DrivenOver: "redfish",
	})

	srv := newServer(t, siteList{{ID: "branch-7", State: "connected", LastSeen: time.Now()}}, book, nil)

	_, list := get(t, srv.URL+"/status/machines")
	require.Contains(t, list, " · Dell Inc. PowerEdge R640, 2 CPUs, 384 GiB</span>")
	require.Contains(t, list, `\x1b[2J&lt;script&gt;`, "the BMC's terminal codes are shown, never sent")
	require.NotContains(t, list, "\x1b")

	_, page := get(t, srv.URL+"/status/machines/"+m1)
	require.Contains(t, page, "<th>Hardware</th><td>Dell Inc. PowerEdge R640, 2 CPUs, 384 GiB</td>")
	require.Contains(t, page, "IPMI at 10.0.0.9:623 (auto: the edge read its inventory over IPMI; it did not answer Redfish)")

	_, page = get(t, srv.URL+"/status/machines/"+m2)
	require.Contains(t, page, "Redfish at 10.0.0.10:623 (auto: the edge read its inventory over Redfish)")
	require.NotContains(t, page, "<script>alert")
}
