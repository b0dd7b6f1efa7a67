package status

import (
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"
)

// Plots are drawn on the server as inline SVG: numbers and escaped labels only, no script.
const (
	plotW, plotH = 560, 140
	plotLeft     = 36 // room for the y axis labels
	plotBottom   = 18 // room for the x axis labels
)

// palette colours series (readable on white, distinct in print). The fleet view gives boots the first three,
// phases and failure reasons the next nine, sites online the last: what a screenshot shows of one plot is not
// another's.
var palette = []string{
	"#1f77b4", "#d62728", "#2ca02c",
	"#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22", "#393b79", "#637939",
	"#8c6d31",
}

// Where each plot's colours begin in the palette.
const (
	bootColours  = 0
	otherColours = 3
	sitesColour  = 12
)

func colour(i int) string { return palette[i%len(palette)] }

// Series is one named line or bar stack of a plot.
type Series struct {
	Name   string
	Values []int
	// Dashed draws a line dashed and grey (a bound others stay under, such as all sites).
	Dashed bool
	// First is where the series' colour is in the palette.
	First int
}

// boundColour is the colour of a dashed line.
const boundColour = "#999999"

func (s Series) colour() string {
	if s.Dashed {
		return boundColour
	}

	return colour(s.First)
}

// Plot is one plot of the fleet view: its SVG and its legend (each series with its total or last value).
type Plot struct {
	ID, Title string
	SVG       template.HTML
	Legend    []LegendItem
	// Points is how many values are drawn that are not zero (0: nothing to show yet).
	Points int
}

// LegendItem is a series as the legend names it.
type LegendItem struct {
	Name  string
	Value int
	// Swatch is the series' colour as a style (one of the palette's).
	Swatch template.CSS
}

// barPlot stacks series per slot (an hour each); labels name the x axis at a few slots.
func barPlot(id, title string, labels []string, series []Series, total bool) Plot {
	slots := len(labels)
	peak := 1

	for i := range slots {
		sum := 0
		for _, s := range series {
			sum += s.Values[i]
		}

		peak = max(peak, sum)
	}

	var b strings.Builder

	p := Plot{ID: id, Title: title}
	openSVG(&b, id, title, peak)

	bw := float64(plotW-plotLeft) / float64(max(slots, 1))

	for i := range slots {
		y := float64(plotH - plotBottom)

		for _, s := range series {
			v := s.Values[i]
			if v == 0 {
				continue
			}

			p.Points++

			h := float64(v) / float64(peak) * float64(plotH-plotBottom-4)
			y -= h
			fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %d</title></rect>`,
				plotLeft+float64(i)*bw+0.5, y, max(bw-1, 1), h, s.colour(), template.HTMLEscapeString(labels[i]), template.HTMLEscapeString(s.Name), v)
		}
	}

	xLabels(&b, labels, func(i int) float64 { return plotLeft + (float64(i)+0.5)*bw })
	b.WriteString(`</svg>`)

	p.SVG = template.HTML(b.String()) // numbers and escaped text only
	p.Legend = legend(series, total)

	return p
}

// linePlot draws each series as a line over the slots.
func linePlot(id, title string, labels []string, series []Series) Plot {
	peak := 1

	for _, s := range series {
		for _, v := range s.Values {
			peak = max(peak, v)
		}
	}

	var b strings.Builder

	p := Plot{ID: id, Title: title}
	openSVG(&b, id, title, peak)

	n := len(labels)
	x := func(i int) float64 {
		if n <= 1 {
			return plotLeft + float64(plotW-plotLeft)/2
		}

		return plotLeft + 4 + float64(i)*float64(plotW-plotLeft-8)/float64(n-1)
	}
	y := func(v int) float64 {
		return float64(plotH-plotBottom) - float64(v)/float64(peak)*float64(plotH-plotBottom-4)
	}

	// dashed bounds first, the lines that matter over them
	order := slices.Concat(
		slices.DeleteFunc(seriesIndexes(series), func(i int) bool { return !series[i].Dashed }),
		slices.DeleteFunc(seriesIndexes(series), func(i int) bool { return series[i].Dashed }))

	for _, si := range order {
		s := series[si]
		if !nonZero(s.Values) {
			continue
		}

		pts := make([]string, 0, len(s.Values))
		for i, v := range s.Values {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))

			if v != 0 {
				p.Points++
			}
		}

		if len(pts) == 1 { // one reading: a short level line, so that it shows
			pts = []string{fmt.Sprintf("%.1f,%.1f", x(0)-16, y(s.Values[0])), fmt.Sprintf("%.1f,%.1f", x(0)+16, y(s.Values[0]))}
		}

		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}

		fmt.Fprintf(&b, `<polyline class="line" fill="none" stroke="%s" stroke-width="2"%s points="%s"><title>%s</title></polyline>`,
			s.colour(), dash, strings.Join(pts, " "), template.HTMLEscapeString(s.Name))
	}

	xLabels(&b, labels, x)
	b.WriteString(`</svg>`)

	p.SVG = template.HTML(b.String()) // numbers and escaped text only
	p.Legend = legend(series, false)

	return p
}

func seriesIndexes(series []Series) []int {
	out := make([]int, len(series))
	for i := range out {
		out[i] = i
	}

	return out
}

func nonZero(vs []int) bool {
	for _, v := range vs {
		if v != 0 {
			return true
		}
	}

	return false
}

func openSVG(b *strings.Builder, id, title string, peak int) {
	fmt.Fprintf(b, `<svg id="%s" class="plot" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		template.HTMLEscapeString(id), plotW, plotH, plotW, plotH, template.HTMLEscapeString(title))
	base := plotH - plotBottom
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/><line x1="%d" y1="4" x2="%d" y2="%d" stroke="#999"/>`,
		plotLeft, base, plotW, base, plotLeft, plotLeft, base)
	fmt.Fprintf(b, `<text x="%d" y="12" font-size="10" text-anchor="end" fill="#555">%d</text><text x="%d" y="%d" font-size="10" text-anchor="end" fill="#555">0</text>`,
		plotLeft-4, peak, plotLeft-4, base)
}

// xLabels names about six evenly spread slots.
func xLabels(b *strings.Builder, labels []string, x func(int) float64) {
	step := max(1, len(labels)/6)

	for i := 0; i < len(labels); i += step {
		at := min(max(x(i), plotLeft+14), plotW-16) // whole labels at both ends
		fmt.Fprintf(b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="#555">%s</text>`,
			at, plotH-4, template.HTMLEscapeString(labels[i]))
	}
}

// legend names the series with a value each: their total, or their last value.
func legend(series []Series, total bool) []LegendItem {
	out := make([]LegendItem, 0, len(series))

	for _, s := range series {
		v := 0

		switch {
		case total:
			for _, n := range s.Values {
				v += n
			}
		case len(s.Values) > 0:
			v = s.Values[len(s.Values)-1]
		}

		out = append(out, LegendItem{Name: s.Name, Value: v, Swatch: template.CSS("opacity:.8;background:" + s.colour())}) // a fixed colour; lighter than the marks, so that a screenshot's marks are told from the legend
	}

	return out
}

// Fleet is the fleet view: plots of the controller's own history.
type Fleet struct {
	Since time.Time
	Plots []Plot
}

// maxLinePoints bounds the points of one line (samples are thinned to it).
const maxLinePoints = 240

// fleetView draws the history, with the fleet as it is now (cur) as the last sample.
func fleetView(h *History, cur Sample) Fleet {
	hours := h.Hours()
	labels := make([]string, len(hours))

	boots := make([]Series, 0, len(BootKinds()))
	for i, k := range BootKinds() {
		boots = append(boots, Series{Name: k, Values: make([]int, len(hours)), First: bootColours + i})
	}

	fails := make([]Series, 0, len(FailureReasons()))
	for i, r := range FailureReasons() {
		fails = append(fails, Series{Name: r, Values: make([]int, len(hours)), First: otherColours + i})
	}

	for i, hr := range hours {
		labels[i] = hr.Start.UTC().Format("15h")

		for j, k := range BootKinds() {
			boots[j].Values[i] = hr.Boots[k]
		}

		for j, r := range FailureReasons() {
			fails[j].Values[i] = hr.Failures[r]
		}
	}

	samples := h.Samples()
	samples = append(samples, cur)

	if len(samples) > maxLinePoints { // evenly thinned, the newest kept
		thin := make([]Sample, 0, maxLinePoints)
		for i := range maxLinePoints {
			thin = append(thin, samples[len(samples)-1-(maxLinePoints-1-i)*(len(samples)-1)/(maxLinePoints-1)])
		}

		samples = thin
	}

	sLabels := make([]string, len(samples))
	phases := make([]Series, 0, len(fleetPhases()))

	for i, ph := range fleetPhases() {
		phases = append(phases, Series{Name: ph, Values: make([]int, len(samples)), First: otherColours + i})
	}

	// all sites dashed and drawn first: online is drawn over it, and shows where the two are equal
	online := []Series{{Name: "online", Values: make([]int, len(samples)), First: sitesColour}, {Name: "all sites", Values: make([]int, len(samples)), Dashed: true}}

	for i, s := range samples {
		sLabels[i] = s.At.UTC().Format("15:04")

		for j := range phases {
			if j < len(s.Phases) {
				phases[j].Values[i] = s.Phases[j]
			}
		}

		online[0].Values[i], online[1].Values[i] = s.SitesOnline, s.Sites
	}

	return Fleet{Since: h.Start(), Plots: []Plot{
		barPlot("plot-boots", "Boots per hour, by what the edge served", labels, boots, true),
		barPlot("plot-failures", "Machines failing per hour, by reason", labels, fails, true),
		linePlot("plot-phases", "Machines by phase", sLabels, phases),
		linePlot("plot-sites", "Sites online", sLabels, online),
	}}
}
