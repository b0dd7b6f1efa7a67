package lab_test

import (
	"bytes"
	"image"
	"image/draw"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	"github.com/outpost-metal/outpost/qemu/lab"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// silentChain is what the lifecycle records while a BMC is silent: the step, the far end's words, the chain.
const silentChain = "Power: power status on bmc 10.0.0.9: open ipmi session: read udp 10.0.0.1:41000->10.0.0.9:623: i/o timeout " +
	"(power status of " + pageM1 + " at site site-1: rpc error: code = DeadlineExceeded desc = power status on bmc 10.0.0.9: " +
	"open ipmi session: read udp 10.0.0.1:41000->10.0.0.9:623: i/o timeout)"

// TestStatusPagesBMCSilentInBrowser loads the controller's real status pages, served on this host's loopback,
// in headless Chromium while a machine's BMC is silent: the machine list names the cause in one line (which
// BMC, since when), never the error chain, which the machine's page keeps; once the BMC answers again the list
// shows no error. The fleet view draws its four plots with data, and a screenshot shows them.
func TestStatusPagesBMCSilentInBrowser(t *testing.T) {
	t.Parallel()

	bin, err := lab.FindChromium()
	if err != nil {
		t.Skipf("status pages in a browser: %v", err)
	}

	b := lab.Browser{Bin: bin}
	ctx := t.Context()

	book := timeline.New(timeline.DefaultConfig(), time.Now)

	pages, err := status.NewPages(status.Options{
		Sites:    pageSites{{ID: "site-1", State: "connected", LastSeen: time.Now()}, {ID: "site-2", State: "offline"}},
		Machines: book, Now: time.Now,
	})
	require.NoError(t, err)

	mux := http.NewServeMux()
	pages.Register(mux)

	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// pageM1 booted, then its BMC went silent: the edge's watch and the lifecycle's calls fail in turn
	book.Summarize(pageM1, lifecycle.MachineSummary{
		Site: "site-1", Phase: lifecycle.PhaseReady, Power: "unknown", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi",
		Waiting: "power state unknown: power status of " + pageM1 + " at site site-1: rpc error: code = DeadlineExceeded desc = open ipmi session: i/o timeout",
	})
	book.Summarize(pageM2, lifecycle.MachineSummary{Site: "site-1", Phase: lifecycle.PhaseReady, Power: "on"})

	// before anything booted: the boots plot's legend is on the page, no bar
	before := filepath.Join(t.TempDir(), "before.png")
	require.NoError(t, b.Screenshot(ctx, srv.URL+"/status/", before))

	for _, id := range []string{pageM1, pageM2} {
		require.NoError(t, book.HandleEvent(ctx, "site-1", &bootpb.Event{Kind: &bootpb.Event_BootServed{
			BootServed: &bootpb.BootServed{Uuid: id, Mode: "agent"},
		}}))
	}

	for range 2 {
		require.NoError(t, book.HandleEvent(ctx, "site-1", &bootpb.Event{Kind: &bootpb.Event_PowerChanged{
			PowerChanged: &bootpb.PowerChanged{MachineId: pageM1, State: "unknown", Error: "open ipmi session: i/o timeout"},
		}}))
		book.Record(pageM1, timeline.KindError, silentChain, true)
	}

	dom, err := b.DumpDOM(ctx, srv.URL+"/status/machines")
	require.NoError(t, err)
	require.NotContains(t, string(dom), "rpc error", "no error chain on the list")

	now, err := lab.ParseMachinesNow(dom)
	require.NoError(t, err)
	require.True(t, now[pageM1].Problem, "%+v", now)
	require.True(t, strings.HasPrefix(now[pageM1].Text, "BMC 10.0.0.9 not answering since "), now[pageM1].Text)
	require.False(t, now[pageM2].Problem, "%+v", now)

	if dir := os.Getenv("OUTPOST_KEEP_SCREENSHOTS"); dir != "" { // for a look at the pages while the BMC is silent
		require.NoError(t, b.Screenshot(ctx, srv.URL+"/status/machines", filepath.Join(dir, "machines-bmc-silent.png")))
		require.NoError(t, b.Screenshot(ctx, srv.URL+"/status/machines/"+pageM1, filepath.Join(dir, "machine-bmc-silent.png")))
	}

	dom, err = b.DumpDOM(ctx, srv.URL+"/status/machines/"+pageM1)
	require.NoError(t, err)
	require.Contains(t, string(dom), "BMC 10.0.0.9 not answering")
	require.Contains(t, string(dom), "code = DeadlineExceeded", "the chain is on the machine's page")

	// the fleet view: four plots, boots and failures with data, drawn in the screenshot
	dom, err = b.DumpDOM(ctx, srv.URL+"/status/")
	require.NoError(t, err)

	plots, err := lab.CheckFleetView(dom, lab.FleetPlots...)
	require.NoError(t, err)

	shot := filepath.Join(t.TempDir(), "fleet.png")
	require.NoError(t, b.Screenshot(ctx, srv.URL+"/status/", shot))
	require.NoError(t, lab.CheckFleetScreenshot(shot, plots, lab.FleetPlots...))
	require.ErrorContains(t, lab.CheckFleetScreenshot(before, plots, "plot-boots", "plot-failures"), "plot plot-boots shows 0 pixels",
		"a legend alone is not a plot")

	// the BMC answers again: the lifecycle reads its power, the edge's watch reports it
	book.Summarize(pageM1, lifecycle.MachineSummary{Site: "site-1", Phase: lifecycle.PhaseReady, Power: "on", BMCAddress: "10.0.0.9", BMCProtocol: "ipmi"})
	require.NoError(t, book.HandleEvent(ctx, "site-1", &bootpb.Event{Kind: &bootpb.Event_PowerChanged{
		PowerChanged: &bootpb.PowerChanged{MachineId: pageM1, State: "on"},
	}}))

	dom, err = b.DumpDOM(ctx, srv.URL+"/status/machines")
	require.NoError(t, err)

	now, err = lab.ParseMachinesNow(dom)
	require.NoError(t, err)
	require.False(t, now[pageM1].Problem, "%+v", now)
	require.NotContains(t, string(dom), "not answering", "none stale")

	if dir := os.Getenv("OUTPOST_KEEP_SCREENSHOTS"); dir != "" { // for a look at the plots
		raw, err := os.ReadFile(shot)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "fleet.png"), raw, 0o644))
	}
}

// A screenshot without a plot's colours fails the check.
func TestCheckFleetScreenshotRefusesBlank(t *testing.T) {
	t.Parallel()

	srv := statusServer(t)

	plots, err := lab.CheckFleetView(fetch(t, srv.URL+"/status/"), "plot-phases")
	require.NoError(t, err)
	require.NotEmpty(t, plots["plot-phases"].Colours)

	_, err = lab.CheckFleetView(fetch(t, srv.URL+"/status/"), "plot-boots")
	require.ErrorContains(t, err, "plot plot-boots draws no data", "nothing booted in this fleet")

	blank := filepath.Join(t.TempDir(), "blank.png")
	require.NoError(t, os.WriteFile(blank, whitePNG(t), 0o644))
	require.ErrorContains(t, lab.CheckFleetScreenshot(blank, plots, "plot-phases"), "shows 0 pixels of its colours")
}

func whitePNG(t *testing.T) []byte {
	t.Helper()

	img := image.NewRGBA(image.Rect(0, 0, 64, 64))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)

	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))

	return buf.Bytes()
}
