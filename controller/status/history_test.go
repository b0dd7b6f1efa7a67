package status_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.t = c.t.Add(d)
}

func TestHistoryCountsBootsAndFailuresPerHour(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)}
	h := status.NewHistory(status.HistoryOptions{}, c.Now)

	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindInstallPlan, Text: "install plan served"})
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindBootServed, Text: "boot script served: agent mode"})
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindPower, Text: "BMC not answering: i/o timeout", Error: true})
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindError, Text: "Power: power status of x at site s: site offline", Error: true})
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindPhase, Text: "ready → installing"}) // neither
	h.Observe("m1", "s", timeline.Entry{At: c.Now().Add(-time.Hour), Kind: timeline.KindDiskBoot, Text: "loaded: before the start"})

	c.Add(time.Hour)
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindDiskBoot, Text: "told to boot from its disk"})
	h.Observe("m1", "s", timeline.Entry{At: c.Now(), Kind: timeline.KindAssetFetch, Text: "download of vmlinuz stopped", Error: true})

	hours := h.Hours()
	require.Len(t, hours, status.HistoryHours)

	prev, cur := hours[len(hours)-2], hours[len(hours)-1]
	require.Equal(t, time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), prev.Start)
	require.Equal(t, map[string]int{status.BootInstall: 1, status.BootAgent: 1}, prev.Boots)
	require.Equal(t, map[string]int{status.ReasonBMC: 1, status.ReasonSiteOffline: 1}, prev.Failures)
	require.Equal(t, map[string]int{status.BootDisk: 1}, cur.Boots)
	require.Equal(t, map[string]int{status.ReasonDownload: 1}, cur.Failures)
	require.Empty(t, hours[0].Boots, "nothing before the history began")

	// 48 hours on, the hours counted then are gone; the ring holds HistoryHours at most
	c.Add(status.HistoryHours * time.Hour)

	for _, hr := range h.Hours() {
		require.Empty(t, hr.Boots, hr.Start)
		require.Empty(t, hr.Failures, hr.Start)
	}
}

func TestHistorySamplesBounded(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)}
	h := status.NewHistory(status.HistoryOptions{MaxSamples: 5}, c.Now)

	for i := range 12 {
		h.Record(status.Sample{At: c.Now(), SitesOnline: i})
		c.Add(time.Minute)
	}

	got := h.Samples()
	require.Len(t, got, 5)

	for i, s := range got {
		require.Equal(t, 7+i, s.SitesOnline, "oldest first, the newest five kept")
	}
}

var pointsAttr = regexp.MustCompile(`data-plot="([a-z-]+)" data-points="(\d+)"`)

// The sites page draws the fleet view: four plots, with data once machines booted and failed, and says since
// when it counts.
func TestFleetViewPlots(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Now().Truncate(time.Hour).Add(10 * time.Minute)}
	book := timeline.New(timeline.DefaultConfig(), c.Now)

	pages, err := status.NewPages(status.Options{
		Sites:    siteList{{ID: "a", State: "connected"}, {ID: "b", State: "offline"}},
		Machines: book, Now: c.Now,
	})
	require.NoError(t, err)

	mux := http.NewServeMux()
	pages.Register(mux)

	srv := httptestServer(t, mux)

	code, body := get(t, srv.URL+"/status/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "since "+c.Now().UTC().Format(time.RFC3339))
	require.Equal(t, map[string]int{"plot-boots": 0, "plot-failures": 0, "plot-phases": 0, "plot-sites": 2}, plotPoints(t, body),
		"nothing has booted yet; one site online of two now")

	for i := range 3 {
		id := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		book.Summarize(id, lifecycle.MachineSummary{Site: "a", Phase: lifecycle.PhaseReady, BMCAddress: "10.0.0.9", BMCProtocol: "ipmi"})
		require.NoError(t, book.HandleEvent(t.Context(), "a", &bootpb.Event{Kind: &bootpb.Event_BootServed{
			BootServed: &bootpb.BootServed{Uuid: id, Mode: "install"},
		}}))
		require.NoError(t, book.HandleEvent(t.Context(), "a", &bootpb.Event{Kind: &bootpb.Event_PowerChanged{
			PowerChanged: &bootpb.PowerChanged{MachineId: id, State: "unknown", Error: "i/o timeout"},
		}}))
	}

	_, body = get(t, srv.URL+"/status/")
	points := plotPoints(t, body)
	require.Equal(t, 1, points["plot-boots"], "three installs in this hour: one bar")
	require.Equal(t, 1, points["plot-failures"])
	require.Equal(t, 1, points["plot-phases"], "three ready machines now")
	require.Contains(t, body, `<title>`+c.Now().UTC().Format("15h")+` install: 3</title>`)
	require.Contains(t, body, `<title>`+c.Now().UTC().Format("15h")+` bmc: 3</title>`)
	require.Len(t, regexp.MustCompile(`<svg id="plot-`).FindAllString(body, -1), 4)
}

func plotPoints(t *testing.T, body string) map[string]int {
	t.Helper()

	out := map[string]int{}

	for _, m := range pointsAttr.FindAllStringSubmatch(body, -1) {
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)

		out[m[1]] = n
	}

	return out
}

func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()

	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	return srv
}

// A machine failing again and again for one reason is one failure an hour, not one per retry.
func TestHistoryCountsFailedMachines(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Date(2026, 12, 4, 10, 5, 0, 0, time.UTC)}
	h := status.NewHistory(status.HistoryOptions{}, c.Now)
	silent := timeline.Entry{Kind: timeline.KindPower, Text: "BMC not answering: i/o timeout", Error: true}
	offline := timeline.Entry{Kind: timeline.KindError, Text: "Power: site offline", Error: true}

	for range 70 {
		silent.At, offline.At = c.Now(), c.Now()
		h.Observe("m1", "s", silent)
		h.Observe("m1", "s", offline)
		h.Observe("m2", "s", silent)
		c.Add(time.Minute) // into the next hour after 55 minutes, 15 minutes in it
	}

	hours := h.Hours()
	require.Equal(t, map[string]int{status.ReasonBMC: 2, status.ReasonSiteOffline: 1}, hours[len(hours)-2].Failures)
	require.Equal(t, map[string]int{status.ReasonBMC: 2, status.ReasonSiteOffline: 1}, hours[len(hours)-1].Failures, "counted again in a new hour")
}
