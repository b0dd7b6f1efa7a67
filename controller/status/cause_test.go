package status_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// What the lifecycle records while a BMC is silent: the step, the far end's words, then the whole chain.
const silentChain = "Power: power status on bmc 10.0.0.9: open ipmi session: read udp 10.0.0.1:41000->10.0.0.9:623: i/o timeout " +
	"(power status of " + m1 + " at site branch-7: rpc error: code = DeadlineExceeded desc = power status on bmc 10.0.0.9: " +
	"open ipmi session: read udp 10.0.0.1:41000->10.0.0.9:623: i/o timeout)"

func silentBMC(t *testing.T, book *timeline.Book, c *clock) {
	t.Helper()

	book.Summarize(m1, lifecycle.MachineSummary{
		Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "unknown", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi",
		Waiting: "power state unknown: power status of " + m1 + " at site branch-7: rpc error: code = DeadlineExceeded desc = power status on bmc 10.0.0.9: i/o timeout",
	})

	for range 3 { // the edge's watch and the lifecycle's calls fail in turn
		require.NoError(t, book.HandleEvent(t.Context(), "branch-7", &bootpb.Event{Kind: &bootpb.Event_PowerChanged{
			PowerChanged: &bootpb.PowerChanged{MachineId: m1, State: "unknown", Error: "open ipmi session: i/o timeout"},
		}}))
		c.Add(time.Minute)
		book.Record(m1, timeline.KindError, silentChain, true)
		c.Add(time.Minute)
	}
}

func TestSummarizeOneLineCause(t *testing.T) {
	t.Parallel()

	start := time.Date(2026, 12, 4, 10, 2, 0, 0, time.UTC)
	c := &clock{t: start}
	book := timeline.New(timeline.DefaultConfig(), c.Now)
	book.Record(m1, timeline.KindBootServed, "boot script served: agent mode", false)
	silentBMC(t, book, c)

	rec, ok := book.Get(m1)
	require.True(t, ok)

	now := status.Summarize(rec, "connected")
	require.True(t, now.Problem)
	require.Equal(t, "BMC 10.0.0.9 not answering", now.Text)
	require.Equal(t, start, now.Since, "since the first failure of the run, not the last")

	// the BMC answers again: the lifecycle reads its power, the edge's watch reports it
	book.Summarize(m1, lifecycle.MachineSummary{Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "on", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi"})
	rec, _ = book.Get(m1)

	now = status.Summarize(rec, "connected")
	require.False(t, now.Problem)
	require.Equal(t, "phase: unknown → ready", now.Text, "the last thing that was not the cleared error")
	require.Equal(t, "BMC 10.0.0.9 not answering", now.Cleared)
}

func TestSummarizeSiteOffline(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Date(2026, 12, 4, 10, 2, 0, 0, time.UTC)}
	book := timeline.New(timeline.DefaultConfig(), c.Now)
	book.Summarize(m1, lifecycle.MachineSummary{Site: "branch-7", Phase: lifecycle.PhaseInstalled, Power: "on"})
	book.Record(m1, timeline.KindError, "Power: power status of "+m1+" at site branch-7: site offline", true)

	rec, _ := book.Get(m1)

	for state, problem := range map[string]bool{"offline": true, "connected": false, "": true} {
		now := status.Summarize(rec, state)
		require.Equal(t, problem, now.Problem, state)

		if problem {
			require.Equal(t, "site branch-7 offline", now.Text, state)
		} else {
			require.Equal(t, "phase: unknown → installed", now.Text)
		}
	}

	// an error of another kind stays until something newer comes
	book.Record(m1, timeline.KindError, "Wipe: no answer within 45s (wipe "+m1+" at site branch-7: rpc error: code = DeadlineExceeded desc = x)", true)
	rec, _ = book.Get(m1)
	now := status.Summarize(rec, "connected")
	require.True(t, now.Problem)
	require.Equal(t, "Wipe: no answer within 45s", now.Text, "the cause, without the chain")
}

// The machine list shows a silent BMC's cause in one line, never the chain; the machine's page has the chain;
// once the BMC answers again, the list no longer shows the error.
func TestPagesSpeakOperator(t *testing.T) {
	t.Parallel()

	c := &clock{t: time.Now().Add(-time.Hour)}
	book := timeline.New(timeline.DefaultConfig(), c.Now)
	silentBMC(t, book, c)

	srv := newServer(t, siteList{{ID: "branch-7", State: "connected"}}, book, nil)

	_, list := get(t, srv.URL+"/status/machines")
	require.Contains(t, list, `<span class="bad problem">BMC 10.0.0.9 not answering</span>`)
	require.NotContains(t, list, "rpc error")
	require.NotContains(t, list, "DeadlineExceeded")
	require.Contains(t, list, "power state unknown: power status on bmc 10.0.0.9: i/o timeout", "why it waits, in the far end's words")

	_, page := get(t, srv.URL+"/status/machines/"+m1)
	require.Contains(t, page, "BMC 10.0.0.9 not answering")
	require.Contains(t, page, "code = DeadlineExceeded", "the chain is on the machine's page")
	require.Contains(t, page, "IPMI at 10.0.0.9 (auto: its BMC did not answer Redfish)")

	book.Summarize(m1, lifecycle.MachineSummary{Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "on", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi"})

	code, list := get(t, srv.URL+"/status/machines")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, list, "not answering")
	require.NotContains(t, list, `class="bad`)
	require.True(t, strings.Contains(list, "phase: unknown → ready"), list)
}

// A site's BMC protocol setting names the protocol.
func TestBMCProtocolSetting(t *testing.T) {
	t.Parallel()

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	book.Summarize(m1, lifecycle.MachineSummary{Site: "branch-7", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi"})

	pages, err := status.NewPages(status.Options{
		Sites: siteList{}, Machines: book, Now: time.Now, BMCProtocol: func(string) string { return "redfish" },
	})
	require.NoError(t, err)

	mux := http.NewServeMux()
	pages.Register(mux)

	srv := httptestServer(t, mux)

	_, page := get(t, srv.URL+"/status/machines/"+m1)
	require.Contains(t, page, "Redfish at 10.0.0.9 (the site&#39;s setting)")
	require.NotContains(t, page, "ipmi at")
}

// Whatever an edge or a BMC put in an entry, its summary is one bounded line.
func FuzzSummarize(f *testing.F) {
	f.Add(silentChain, "power", true)
	f.Add("Wipe: x (rpc error: y)", "error", true)
	f.Add("\n\t (  (rpc error", "error", false)

	f.Fuzz(func(t *testing.T, text, kind string, failed bool) {
		rec := timeline.Record{Machine: timeline.Machine{Site: "s", BMCAddress: "10.0.0.9"}, Entries: []timeline.Entry{{Kind: kind, Text: text, Error: failed}}}

		now := status.Summarize(rec, "offline")
		if strings.ContainsAny(now.Text, "\n\r\t") || len(now.Text) > 200 {
			t.Fatalf("summary %q is not one bounded line", now.Text)
		}
	})
}

// The machine list names each machine's interfaces beside its UUID: what an operator finds on the machine.
func TestMachineListShowsMACs(t *testing.T) {
	t.Parallel()

	book := timeline.New(timeline.DefaultConfig(), time.Now)
	require.NoError(t, book.HandleEvent(t.Context(), "branch-7", &bootpb.Event{Kind: &bootpb.Event_BootServed{
		BootServed: &bootpb.BootServed{Uuid: m1, Mode: "agent", Mac: "52:54:00:12:34:56"},
	}}))

	srv := newServer(t, siteList{{ID: "branch-7", State: "connected"}}, book, nil)

	_, list := get(t, srv.URL+"/status/machines")
	require.Contains(t, list, `<code>`+m1+`</code></a><br><span class="muted">52:54:00:12:34:56</span>`)
}
