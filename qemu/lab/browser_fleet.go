package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/net/html"
)

// PagePlot is one plot of the status page's fleet view as a browser rendered it.
type PagePlot struct {
	ID string
	// Points is how many values the page says the plot draws that are not zero.
	Points int
	// Marks counts the bars and lines inside its SVG.
	Marks int
	// Colours are the fill and stroke colours of those marks ("#1f77b4"), each once.
	Colours []string
}

// FleetPlots are the plots of the fleet view.
var FleetPlots = []string{"plot-boots", "plot-failures", "plot-phases", "plot-sites"}

// maxPlots bounds the plots read from one page.
const maxPlots = 64

// ParseFleetView reads the fleet view's plots (figure elements with data-plot) from a sites page.
func ParseFleetView(dom []byte) (map[string]PagePlot, error) {
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		return nil, err
	}

	out := map[string]PagePlot{}

	for n := range doc.Descendants() {
		id, ok := attr(n, "data-plot")
		if n.Type != html.ElementNode || n.Data != "figure" || !ok {
			continue
		}

		if len(out) >= maxPlots {
			return nil, fmt.Errorf("over %d plots", maxPlots)
		}

		p := PagePlot{ID: id}

		s, _ := attr(n, "data-points")
		if p.Points, err = strconv.Atoi(s); err != nil || p.Points < 0 {
			return nil, fmt.Errorf("plot %q: data-points %q is not a count", id, s)
		}

		svg := find(n, "svg")
		if svg == nil {
			return nil, fmt.Errorf("plot %q: no svg", id)
		}

		for c := range svg.Descendants() {
			class, _ := attr(c, "class")
			if c.Type != html.ElementNode || (class != "bar" && class != "line") {
				continue
			}

			p.Marks++

			for _, key := range []string{"fill", "stroke"} {
				if v, ok := attr(c, key); ok && strings.HasPrefix(v, "#") && !slices.Contains(p.Colours, v) {
					p.Colours = append(p.Colours, v)
				}
			}
		}

		out[id] = p
	}

	return out, nil
}

func attr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}

	return "", false
}

// CheckFleetView tells whether a sites page draws every fleet plot as SVG, and the plots named in withData
// with data: values the page counts, and bars or lines drawn for them.
func CheckFleetView(dom []byte, withData ...string) (map[string]PagePlot, error) {
	plots, err := ParseFleetView(dom)
	if err != nil {
		return nil, err
	}

	var errs []error

	for _, id := range FleetPlots {
		if _, ok := plots[id]; !ok {
			errs = append(errs, fmt.Errorf("fleet view: no plot %s", id))
		}
	}

	for _, id := range withData {
		if p := plots[id]; p.Points == 0 || p.Marks == 0 {
			errs = append(errs, fmt.Errorf("fleet view: plot %s draws no data (%d values, %d marks)", id, p.Points, p.Marks))
		}
	}

	return plots, errors.Join(errs...)
}

// maxScreenshotPixels bounds the screenshot decoded.
const maxScreenshotPixels = 4096 * 4096

// ScreenshotColours counts the pixels of a PNG screenshot in each of colours ("#rrggbb"; within 2 per channel:
// what a plot's bar or line shows once rendered).
func ScreenshotColours(path string, colours []string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck

	cfg, err := png.DecodeConfig(f)
	if err != nil {
		return nil, fmt.Errorf("screenshot %s: %w", path, err)
	}

	if cfg.Width*cfg.Height > maxScreenshotPixels {
		return nil, fmt.Errorf("screenshot %s: %dx%d is too large", path, cfg.Width, cfg.Height)
	}

	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}

	img, err := png.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("screenshot %s: %w", path, err)
	}

	type rgb struct{ r, g, b int }

	want := make(map[string]rgb, len(colours))

	for _, c := range colours {
		var v rgb
		if _, err := fmt.Sscanf(c, "#%02x%02x%02x", &v.r, &v.g, &v.b); err != nil || len(c) != 7 {
			return nil, fmt.Errorf("colour %q is not #rrggbb", c)
		}

		want[c] = v
	}

	out := make(map[string]int, len(want))
	bounds := img.Bounds()

	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()

			for name, c := range want {
				if near(int(r>>8), c.r) && near(int(g>>8), c.g) && near(int(b>>8), c.b) {
					out[name]++
				}
			}
		}
	}

	return out, nil
}

func near(a, b int) bool { return a-b <= 2 && b-a <= 2 }

// minPlotPixels is how many pixels of a plot's colours a screenshot must show for the plot to count as drawn.
const minPlotPixels = 30

// CheckFleetScreenshot tells whether a screenshot of a sites page shows the marks of the plots named (their
// colours, as the page's DOM gives them).
func CheckFleetScreenshot(path string, plots map[string]PagePlot, ids ...string) error {
	var errs []error

	for _, id := range ids {
		counts, err := ScreenshotColours(path, plots[id].Colours)
		if err != nil {
			return err
		}

		total := 0
		for _, n := range counts {
			total += n
		}

		if total < minPlotPixels {
			errs = append(errs, fmt.Errorf("screenshot %s: plot %s shows %d pixels of its colours %v, want %d or more",
				path, id, total, plots[id].Colours, minPlotPixels))
		}
	}

	return errors.Join(errs...)
}

// checkFleetView checks the fleet view on the lab controller's sites page: every plot drawn, boots, machines by
// phase and sites online with data (the scenario booted machines by now), and the screenshot at shot showing
// the boots plot's bars.
func (e *Env) checkFleetView(ctx context.Context, b Browser, shot string) error {
	dom, err := b.DumpDOM(ctx, statusURL("/"))
	if err != nil {
		return err
	}

	plots, err := CheckFleetView(dom, "plot-boots", "plot-phases", "plot-sites")
	if err != nil {
		return err
	}

	if err := b.Screenshot(ctx, statusURL("/"), shot); err != nil {
		return err
	}

	if err := CheckFleetScreenshot(shot, plots, "plot-boots", "plot-sites"); err != nil {
		return err
	}

	e.Lab.log.Info("fleet view checked", zap.String("screenshot", shot), zap.Any("plots", plots))

	return nil
}

// PageNow is a machine list row's Now cell: the machine's current problem in one line, or its last event.
type PageNow struct {
	Text string
	// Problem is set when the cell shows a problem that still holds.
	Problem bool
}

// ParseMachinesNow reads each machine's Now cell (the list's last column) from a status machine list, by ID.
func ParseMachinesNow(dom []byte) (map[string]PageNow, error) {
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		return nil, err
	}

	root := findID(doc, "main")
	if root == nil {
		return nil, errors.New(`no element with id "main" in the page`)
	}

	out := map[string]PageNow{}

	for _, tr := range findAll(root, "tr") {
		if len(out) >= maxRows {
			return nil, fmt.Errorf("over %d table rows", maxRows)
		}

		var tds []*html.Node

		for c := tr.FirstChild; c != nil; c = c.NextSibling {
			if c.Type == html.ElementNode && c.Data == "td" {
				tds = append(tds, c)
			}
		}

		if len(tds) != 6 {
			continue
		}

		now := PageNow{Text: text(tds[5])}

		for c := range tds[5].Descendants() {
			if class, _ := attr(c, "class"); slices.Contains(strings.Fields(class), "problem") {
				now.Problem = true
			}
		}

		out[firstField(text(tds[0]))] = now
	}

	return out, nil
}
