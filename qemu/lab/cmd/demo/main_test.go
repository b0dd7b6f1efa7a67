package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPlainLines checks the output for a file: one line per change (the step, each machine whose row
// changed), nothing when nothing changed, no terminal codes even when a serial console sends some.
func TestPlainLines(t *testing.T) {
	t.Parallel()

	var out bytes.Buffer

	p := &plainLines{w: &out, now: func() time.Time { return time.Date(2026, 12, 4, 7, 1, 2, 0, time.UTC) }, shown: map[string]string{}}

	rows := []row{
		{Site: "site1", Machine: "site1-bios", Power: "off", Phase: "-"},
		{Site: "site1", Machine: "site1-uefi", Power: "off", Phase: "-"},
	}

	p.print("running the scenario", rows)
	require.Equal(t, "07:01:02 step: running the scenario\n"+
		"07:01:02 site1/site1-bios power=off phase=- last=\"\"\n"+
		"07:01:02 site1/site1-uefi power=off phase=- last=\"\"\n", out.String())

	out.Reset()
	p.print("running the scenario", rows)
	require.Empty(t, out.String(), "nothing changed, nothing printed")

	rows[1].Power, rows[1].Phase, rows[1].LastEvent = "on", "wiping", "\x1b[2JOUTPOST-AGENT-UP\r"
	p.print("done: accept", rows)
	require.Equal(t, "07:01:02 step: done: accept\n"+
		"07:01:02 site1/site1-uefi power=on phase=wiping last=\"OUTPOST-AGENT-UP\"\n", out.String())
	require.NotContains(t, out.String(), "\x1b")
}

// TestTimed checks a long build's lines: when it starts, while it runs, when it is done or failed.
func TestTimed(t *testing.T) {
	t.Parallel()

	out := &watchedBuffer{still: make(chan struct{})}

	v, err := timedEvery(out, "building things", 10*time.Millisecond, func() (int, error) {
		select { // the build lasts until the first "still" line is out
		case <-out.still:
			return 7, nil
		case <-time.After(10 * time.Second):
			return 0, errors.New("no still line in 10s")
		}
	})
	require.NoError(t, err)
	require.Equal(t, 7, v)

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Equal(t, "==> building things", lines[0])
	require.Regexp(t, `^    still building things \(\d+s\)$`, lines[1])
	require.Regexp(t, `^==> done building things \(\d+s\)$`, lines[len(lines)-1])

	var failed bytes.Buffer

	_, err = timedEvery(&failed, "building more", time.Hour, func() (int, error) { return 0, errors.New("boom") })
	require.EqualError(t, err, "boom")
	require.Regexp(t, `^==> building more\n==> failed building more after \d+s\n$`, failed.String())
}

// watchedBuffer collects lines written from another goroutine and closes still at the first "still" line.
type watchedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	still chan struct{}
	once  sync.Once
}

func (b *watchedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	if bytes.Contains(p, []byte("still")) {
		b.once.Do(func() { close(b.still) })
	}

	return b.buf.Write(p)
}

func (b *watchedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.buf.String()
}

// TestPrune checks that the oldest runs beyond the kept ones are the ones deleted.
func TestPrune(t *testing.T) {
	t.Parallel()

	runs := t.TempDir()
	for _, n := range []string{"20261204-070000", "20261203-100000", "20261204-080000", "20261201-000000"} {
		require.NoError(t, os.Mkdir(filepath.Join(runs, n), 0o755))
	}

	require.Equal(t, []string{filepath.Join(runs, "20261201-000000"), filepath.Join(runs, "20261203-100000")}, prune(runs, 2))
	require.Empty(t, prune(runs, 4))
	require.Empty(t, prune(filepath.Join(runs, "missing"), 1))
}

// TestSweepStaleLeavesLiveLabs checks that a lab whose process runs keeps its namespaces and its record.
func TestSweepStaleLeavesLiveLabs(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lab.pid"), []byte("1"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "namespaces"), []byte("ol-core-000000\n"), 0o644))

	require.Empty(t, sweepStale([]string{dir}))
	require.FileExists(t, filepath.Join(dir, "namespaces"))
}

// TestForward checks the status page forward: a request on the host's side reaches the page, and the
// listener closes when the lab's context ends.
func TestForward(t *testing.T) {
	t.Parallel()

	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "status page") //nolint:errcheck
	}))
	t.Cleanup(page.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})

	go func() {
		defer close(done)

		forward(ctx, ln, func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", page.Listener.Addr().String())
		})
	}()

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	resp, err := client.Get("http://" + ln.Addr().String() + "/status/")
	require.NoError(t, err)

	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "status page", string(body))

	cancel()

	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the forward still accepts after its context ended")
	}

	_, err = client.Get("http://" + ln.Addr().String() + "/status/")
	require.Error(t, err)
}

// TestHowToOpen checks that the ways to open the page name the forwarded port and the namespace.
func TestHowToOpen(t *testing.T) {
	t.Parallel()

	lines := howToOpen("http://127.0.0.1:41234/status/", "ol-core-abcdef")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "open http://127.0.0.1:41234/status/ in a browser")
	require.Contains(t, lines[1], "ssh -L 41234:127.0.0.1:41234 ")
	require.Contains(t, lines[2], "ip netns exec ol-core-abcdef curl -s http://127.0.0.1:9464/status/")
}

// TestCleanText checks that a serial console's terminal codes quoted in the timeline come out as plain text.
func TestCleanText(t *testing.T) {
	t.Parallel()

	in := "| step | \x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: loading Boot0001\r |\n" +
		"\x1b[1m\x1b[37m\x1b[40miPXE 1.0.0\x1b[0m -- Open Source\x1bc\tok\n"
	require.Equal(t, "| step | BdsDxe: loading Boot0001 |\niPXE 1.0.0 -- Open Source\tok\n", cleanText(in))
	require.Equal(t, "BdsDxe: loading Boot0001 - iPXE", clean("\x1b[2JBdsDxe: loading Boot0001\r\n - \x1b[1miPXE"))
}

// TestDraw checks the live table: the page's address and the Ctrl-C promise in the heading, one row per
// machine with the phase given.
func TestDraw(t *testing.T) {
	t.Parallel()

	var b bytes.Buffer

	h := header{omni: "the Omni stand-in", logs: "/x/_out/demo/runs/1", open: howToOpen("http://127.0.0.1:9464/status/", "ol-core-1"), keep: true}
	draw(&b, h, "running", []row{{Site: "site1", Machine: "site1-bios", Power: "on", Phase: "wiping", LastEvent: "OUTPOST-AGENT-UP"}}, time.Now())

	out := b.String()
	require.True(t, strings.HasPrefix(out, "\x1b[H\x1b[2J"))
	require.Contains(t, out, "it stays up after the scenario until Ctrl-C")
	require.Contains(t, out, "open http://127.0.0.1:9464/status/")
	require.Regexp(t, `(?m)^site1 +site1-bios +on +wiping +OUTPOST-AGENT-UP$`, out)

	b.Reset()
	h.keep = false
	draw(&b, h, "running", nil, time.Now())
	require.Contains(t, b.String(), "it is torn down when the scenario ends")
}
