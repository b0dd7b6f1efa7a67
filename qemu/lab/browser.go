package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/html"
)

// ControllerHTTPPort is the lab controller's HTTP port on the core namespace's loopback: the status pages
// need no token there, and only processes inside the namespace reach it.
const ControllerHTTPPort = 9464

// browserTimeout bounds one headless browser run (a page load, a DOM dump or a screenshot).
const browserTimeout = 90 * time.Second

// maxBrowserOutput bounds what is kept of a browser's standard output (the dumped DOM) and error output.
const maxBrowserOutput = 8 << 20

// chromiumNames are the names Debian and other distributions give the Chromium binary.
var chromiumNames = []string{"chromium", "chromium-browser"}

// FindChromium returns the path of a Chromium binary, or why there is none.
func FindChromium() (string, error) {
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}

	return "", fmt.Errorf("no chromium binary in PATH (hack/deps.sh installs Debian's chromium as root)")
}

// Browser is headless Chromium run inside a lab namespace, so it reaches what listens on that namespace's
// loopback (NS empty: on this host, for pages served on its own loopback).
type Browser struct {
	Bin string
	NS  string
}

// DumpDOM loads url and returns the DOM after the page's scripts ran.
func (b Browser) DumpDOM(ctx context.Context, url string) ([]byte, error) {
	return b.run(ctx, "--dump-dom", url)
}

// Screenshot loads url and writes a PNG of it to path.
func (b Browser) Screenshot(ctx context.Context, url, path string) error {
	if _, err := b.run(ctx, "--screenshot="+path, "--window-size=1280,1600", "--hide-scrollbars", url); err != nil {
		return err
	}

	head := make([]byte, 8)

	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("screenshot of %s: %w", url, err)
	}
	defer f.Close() //nolint:errcheck

	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, []byte("\x89PNG\r\n\x1a\n")) {
		return fmt.Errorf("screenshot of %s: %s is not a PNG", url, path)
	}

	return nil
}

// run runs one headless browser with a fresh profile in a temporary directory, bounded in time and output.
// The browser starts helper processes: it runs in its own process group, all of which is killed when the
// time is up.
func (b Browser) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()

	profile, err := os.MkdirTemp("", "outpost-lab-chromium-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(profile) //nolint:errcheck

	full := append([]string{
		b.Bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--disable-background-networking", "--user-data-dir=" + profile,
	}, args...)

	if b.NS != "" {
		full = append([]string{"ip", "netns", "exec", b.NS}, full...)
	}

	stdout, stderr := &cappedBuffer{max: maxBrowserOutput}, &cappedBuffer{max: 64 << 10}

	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second

	err = cmd.Run()

	// Helpers the browser left behind go with it.
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
	}

	if err != nil {
		return nil, fmt.Errorf("chromium %s: %w: %s", strings.Join(args, " "), err, tail(stderr.Bytes(), 2000))
	}

	if stdout.overflow {
		return nil, fmt.Errorf("chromium %s: output over %d bytes", strings.Join(args, " "), maxBrowserOutput)
	}

	return stdout.Bytes(), nil
}

// cappedBuffer keeps the first max bytes written to it and notes that more came.
type cappedBuffer struct {
	bytes.Buffer

	max      int
	overflow bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); len(p) > room {
		c.overflow = true
		c.Buffer.Write(p[:max(room, 0)])

		return len(p), nil
	}

	return c.Buffer.Write(p)
}

func tail(b []byte, n int) string {
	return string(b[max(len(b)-n, 0):])
}

// PageSite is a row of the status sites page.
type PageSite struct {
	ID, State string
	// Boots is how the site's machines boot, as the page says it.
	Boots string
	// Phases counts the site's machines by phase, as its links say ("ready: 2").
	Phases map[string]int
}

// PageMachine is a row of the status machine list, or the head of a machine's page.
type PageMachine struct {
	ID, Site, Phase string
}

// PageEntry is a row of a machine page's timeline.
type PageEntry struct {
	Kind, Text string
}

// ParseSitesPage reads the sites table of a status sites page.
func ParseSitesPage(dom []byte) ([]PageSite, error) {
	rows, err := tableRows(dom, "main")
	if err != nil {
		return nil, err
	}

	var out []PageSite

	for _, r := range rows {
		if len(r) != 7 || r[0].header {
			continue
		}

		s := PageSite{ID: firstField(r[0].text), State: r[1].text, Boots: r[4].text, Phases: map[string]int{}}

		for _, link := range r[6].links {
			phase, count, ok := strings.Cut(link, ":")
			if !ok {
				return nil, fmt.Errorf("site %s: phase link %q is not phase: count", s.ID, link)
			}

			n, err := strconv.Atoi(strings.TrimSpace(count))
			if err != nil || n < 0 {
				return nil, fmt.Errorf("site %s: phase link %q: bad count", s.ID, link)
			}

			s.Phases[strings.TrimSpace(phase)] += n
		}

		out = append(out, s)
	}

	return out, nil
}

// ParseMachinesPage reads the table of a status machine list.
func ParseMachinesPage(dom []byte) ([]PageMachine, error) {
	rows, err := tableRows(dom, "main")
	if err != nil {
		return nil, err
	}

	var out []PageMachine

	for _, r := range rows {
		if len(r) != 6 || r[0].header {
			continue
		}

		out = append(out, PageMachine{ID: firstField(r[0].text), Site: r[1].text, Phase: firstField(r[2].text)})
	}

	return out, nil
}

// ParseMachinePage reads a status machine page: its ID, site and phase, and its timeline in page order.
func ParseMachinePage(dom []byte) (PageMachine, []PageEntry, error) {
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		return PageMachine{}, nil, err
	}

	var m PageMachine

	if h1 := find(doc, "h1"); h1 != nil {
		if code := find(h1, "code"); code != nil {
			m.ID = strings.TrimSpace(text(code))
		}
	}

	rows, err := tableRows(dom, "main")
	if err != nil {
		return PageMachine{}, nil, err
	}

	var entries []PageEntry

	for _, r := range rows {
		switch {
		case len(r) == 2 && r[0].header && r[0].text == "Site":
			m.Site = r[1].text
		case len(r) == 2 && r[0].header && r[0].text == "Phase":
			m.Phase = firstField(r[1].text)
		case len(r) == 3 && !r[0].header:
			entries = append(entries, PageEntry{Kind: r[1].text, Text: r[2].text})
		}
	}

	if m.ID == "" {
		return PageMachine{}, nil, errors.New("machine page without a machine ID heading")
	}

	return m, entries, nil
}

// cell is one table cell: its text (whitespace collapsed), the texts of its links, whether it is a header.
type cell struct {
	text   string
	links  []string
	header bool
}

// maxRows bounds the rows read from one page.
const maxRows = 10000

// tableRows returns the cells of every table row inside the element with the given id.
func tableRows(dom []byte, id string) ([][]cell, error) {
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		return nil, err
	}

	root := findID(doc, id)
	if root == nil {
		return nil, fmt.Errorf("no element with id %q in the page", id)
	}

	var rows [][]cell

	var walk func(n *html.Node) error
	walk = func(n *html.Node) error {
		if n.Type == html.ElementNode && n.Data == "tr" {
			if len(rows) >= maxRows {
				return fmt.Errorf("page has over %d table rows", maxRows)
			}

			var r []cell

			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type != html.ElementNode || (c.Data != "td" && c.Data != "th") {
					continue
				}

				cl := cell{text: text(c), header: c.Data == "th"}

				for _, a := range findAll(c, "a") {
					cl.links = append(cl.links, text(a))
				}

				r = append(r, cl)
			}

			rows = append(rows, r)

			return nil
		}

		for c := n.FirstChild; c != nil; c = c.NextSibling {
			if err := walk(c); err != nil {
				return err
			}
		}

		return nil
	}

	return rows, walk(root)
}

// text is the text inside n, element boundaries counted as spaces, whitespace collapsed.
func text(n *html.Node) string {
	var b strings.Builder

	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}

		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}

		if n.Type == html.ElementNode {
			b.WriteByte(' ')
		}
	}
	walk(n)

	return strings.Join(strings.Fields(b.String()), " ")
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}

	return ""
}

func find(n *html.Node, tag string) *html.Node {
	if all := findAll(n, tag); len(all) > 0 {
		return all[0]
	}

	return nil
}

func findAll(n *html.Node, tag string) []*html.Node {
	var out []*html.Node

	for c := range n.Descendants() {
		if c.Type == html.ElementNode && c.Data == tag {
			out = append(out, c)
		}
	}

	return out
}

func findID(n *html.Node, id string) *html.Node {
	for c := range n.Descendants() {
		if c.Type != html.ElementNode {
			continue
		}

		for _, a := range c.Attr {
			if a.Key == "id" && a.Val == id {
				return c
			}
		}
	}

	return nil
}

// bootOrder are the timeline kinds an accepted lab machine's page lists, first occurrences in this order: its
// boot script served, its agent's tunnel up, the acceptance wipe started and finished.
var bootOrder = []string{"boot-served", "agent-up", "wipe-started", "wipe-finished"}

// CheckBootOrder tells whether entries hold each of the boot steps, the first of each in bootOrder's order.
func CheckBootOrder(entries []PageEntry) error {
	last, lastKind := -1, ""

	for _, kind := range bootOrder {
		i := slices.IndexFunc(entries, func(e PageEntry) bool { return e.Kind == kind })
		if i < 0 {
			return fmt.Errorf("timeline has no %s entry (kinds: %s)", kind, kinds(entries))
		}

		if i < last {
			return fmt.Errorf("timeline lists %s (row %d) before %s (row %d)", kind, i+1, lastKind, last+1)
		}

		last, lastKind = i, kind
	}

	return nil
}

func kinds(entries []PageEntry) string {
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Kind)
	}

	return strings.Join(out, ", ")
}

// cliMachine is a machine as `controller machine list --output json` prints it.
type cliMachine struct {
	MachineID string `json:"machineId"`
	SiteID    string `json:"siteId"`
	Phase     string `json:"phase"`
}

// MachinePhases returns the controller's own reading of each machine's site and phase, by ID, from its CLI
// (`controller machine list --output json`), independent of the status pages.
func (c *Controller) MachinePhases(ctx context.Context) (map[string]PageMachine, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	var stdout, stderr bytes.Buffer

	cmd := exec.CommandContext(ctx, c.Bin, "machine", "list", "--output", "json", "--state-dir", c.StateDir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("controller machine list: %w: %s", err, stderr.String())
	}

	var list struct {
		Machines []cliMachine `json:"machines"`
	}

	if err := json.Unmarshal(stdout.Bytes(), &list); err != nil {
		return nil, fmt.Errorf("controller machine list: %w", err)
	}

	out := make(map[string]PageMachine, len(list.Machines))
	for _, m := range list.Machines {
		out[strings.ToLower(m.MachineID)] = PageMachine{ID: m.MachineID, Site: m.SiteID, Phase: m.Phase}
	}

	return out, nil
}

// browserSkip says why the browser check cannot run here ("" when it can).
func browserSkip() string {
	if _, err := FindChromium(); err != nil {
		return err.Error()
	}

	return ""
}

// statusURL is a status page's address inside the core namespace.
func statusURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/status%s", ControllerHTTPPort, path)
}

// checkStatusPages loads the controller's status pages in headless Chromium inside the core namespace: the
// sites page, the machine list and each of ms's pages. Every machine must appear at its site with the phase
// the controller's CLI reports at the same moment (read before and after the pages; the check is repeated
// until both readings agree with the pages, within a deadline), each site connected with its machines
// counted by phase, and each machine's timeline must list its boot steps in order; the sites page's fleet view
// must draw its plots, with data, in a screenshot too (checkFleetView). want is the phase the
// scenario expects of each machine at this point, which the CLI's reading and the pages must both show. A
// screenshot of each page is kept under the lab directory.
func (e *Env) checkStatusPages(ctx context.Context, want map[*Machine]string) error {
	ms := slices.SortedFunc(maps.Keys(want), func(a, b *Machine) int { return strings.Compare(a.Spec.Name, b.Spec.Name) })

	bin, err := FindChromium()
	if err != nil {
		return err
	}

	b := Browser{Bin: bin, NS: e.Core.NS}

	var last error

	deadline := time.Now().Add(3 * time.Minute)

	for {
		last = e.compareStatusPages(ctx, b, ms, want)
		if last == nil {
			break
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("status pages: %w", last)
		}

		e.Lab.log.Info("status pages do not match the controller yet", zap.Error(last))

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}

	dir := filepath.Join(e.Lab.Dir, "status-pages")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	shots := map[string]string{"sites.png": statusURL("/"), "machines.png": statusURL("/machines")}
	for _, m := range ms {
		shots["machine-"+m.Spec.Name+".png"] = statusURL("/machines/" + strings.ToLower(m.Spec.UUID))
	}

	for name, url := range shots {
		path := filepath.Join(dir, name)
		if err := b.Screenshot(ctx, url, path); err != nil {
			return err
		}

		e.Lab.log.Info("status page screenshot", zap.String("url", url), zap.String("path", path))
	}

	return e.checkFleetView(ctx, b, filepath.Join(dir, "fleet.png"))
}

// compareStatusPages is one reading of checkStatusPages.
func (e *Env) compareStatusPages(ctx context.Context, b Browser, ms []*Machine, want map[*Machine]string) error {
	before, err := e.Controller.MachinePhases(ctx)
	if err != nil {
		return err
	}

	sitesDOM, err := b.DumpDOM(ctx, statusURL("/"))
	if err != nil {
		return err
	}

	listDOM, err := b.DumpDOM(ctx, statusURL("/machines"))
	if err != nil {
		return err
	}

	pages := make(map[*Machine][]byte, len(ms))
	for _, m := range ms {
		if pages[m], err = b.DumpDOM(ctx, statusURL("/machines/"+strings.ToLower(m.Spec.UUID))); err != nil {
			return err
		}
	}

	after, err := e.Controller.MachinePhases(ctx)
	if err != nil {
		return err
	}

	sites, err := ParseSitesPage(sitesDOM)
	if err != nil {
		return fmt.Errorf("sites page: %w", err)
	}

	list, err := ParseMachinesPage(listDOM)
	if err != nil {
		return fmt.Errorf("machine list: %w", err)
	}

	var errs []error

	for _, m := range ms {
		id := strings.ToLower(m.Spec.UUID)

		cli, ok := before[id]
		if !ok || after[id] != cli {
			errs = append(errs, fmt.Errorf("%s: the controller's CLI reads %+v then %+v", m.Spec.Name, cli, after[id]))

			continue
		}

		if cli.Site != m.Site.Name || cli.Phase != want[m] {
			errs = append(errs, fmt.Errorf("%s: the controller's CLI has it at site %q in phase %q, the scenario expects %q %q",
				m.Spec.Name, cli.Site, cli.Phase, m.Site.Name, want[m]))
		}

		i := slices.IndexFunc(list, func(p PageMachine) bool { return strings.EqualFold(p.ID, id) })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%s: not in the machine list", m.Spec.Name))
		} else if list[i].Site != cli.Site || list[i].Phase != cli.Phase {
			errs = append(errs, fmt.Errorf("%s: the machine list shows site %q phase %q, the CLI %q %q", m.Spec.Name,
				list[i].Site, list[i].Phase, cli.Site, cli.Phase))
		}

		page, entries, err := ParseMachinePage(pages[m])

		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: machine page: %w", m.Spec.Name, err))
		case !strings.EqualFold(page.ID, id) || page.Site != cli.Site || page.Phase != cli.Phase:
			errs = append(errs, fmt.Errorf("%s: its page shows %+v, the CLI %+v", m.Spec.Name, page, cli))
		default:
			if err := CheckBootOrder(entries); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.Spec.Name, err))
			}
		}
	}

	// Each lab site: connected, its machines counted by phase as the CLI counts them.
	for _, s := range e.Sites {
		counts := map[string]int{}

		for _, c := range after {
			if c.Site == s.Name {
				counts[c.Phase]++
			}
		}

		i := slices.IndexFunc(sites, func(p PageSite) bool { return p.ID == s.Name })

		switch {
		case i < 0:
			errs = append(errs, fmt.Errorf("site %s: not on the sites page", s.Name))
		case sites[i].State != "connected":
			errs = append(errs, fmt.Errorf("site %s: link %q on the sites page", s.Name, sites[i].State))
		case !maps.Equal(sites[i].Phases, counts):
			errs = append(errs, fmt.Errorf("site %s: the sites page counts %v by phase, the CLI %v", s.Name, sites[i].Phases, counts))
		}
	}

	return errors.Join(errs...)
}
