package simulate

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The SVG report's layout, in pixels, and its colours (the HTML report's).
const (
	svgWidth    = 960
	svgLeft     = 64 // room for the y axis's labels
	svgRight    = 16
	svgTop      = 52 // the report's title and legend
	svgPanel    = 120
	svgPanelGap = 56 // a panel's heading above it, its x labels below

	admittedColour = "#2a9d3f"
	deniedColour   = "#d1495b"
)

// SVGColumns returns how the SVG report of a Result of seconds seconds
// groups them, as every report does: StepFor's bucket of seconds to a
// column, columns in all, at most MaxColumns.
func SVGColumns(seconds int) (bucket, columns int) {
	seconds = max(seconds, 1)
	bucket = StepFor(seconds)
	return bucket, (seconds + bucket - 1) / bucket
}

// WriteSVG writes r as a static SVG image: one panel per Series the
// traffic reached (Series.Reached; a line under the title lists the
// others), each a column per second (or per SVGColumns' bucket of
// seconds, for a pattern longer than 2 minutes) of the requests admitted (green, from the
// axis up) with those denied (red) stacked on them, all panels on one
// scale, the traffic's, so that they compare; title (the traffic, say)
// heads it. Each panel is a
// <g class="series"> whose data-limit, data-admitted and data-denied
// attributes hold its limit and totals, and whose paths of class admitted
// and denied draw the columns from the baseline up with V and H commands
// only. It needs nothing else to be viewed.
func WriteSVG(w io.Writer, title string, r Result) error {
	bucket, cols := SVGColumns(r.Seconds)
	sr := &svgReport{bw: bufio.NewWriter(w), bucket: bucket, cols: cols, plotW: float64(svgWidth - svgLeft - svgRight), top: 1, top0: svgTop}
	sr.colW = sr.plotW / float64(cols)
	reached, others := r.ReachedSeries()
	for _, s := range r.Series {
		for c := range cols {
			sr.top = max(sr.top, sr.sum(s.Admitted, c)+sr.sum(s.Denied, c))
		}
	}
	if len(others) > 0 {
		sr.top0 += 20
	}
	sr.head(title, r, reached, others)
	for i, s := range reached {
		sr.panel(i, s, r.Seconds)
	}
	sr.p("</svg>\n")
	if err := sr.bw.Flush(); err != nil {
		return fmt.Errorf("svg report: %w", err)
	}
	return nil
}

// svgReport is WriteSVG's report being written: its layout, and the
// scale all panels share.
type svgReport struct {
	bw          *bufio.Writer
	bucket      int     // seconds a column
	cols        int     // columns a panel
	plotW, colW float64 // a panel's width, a column's
	top         int64   // the most requests in a column of any series: the panels' scale
	top0        int     // the first panel's heading
}

// p writes a formatted piece of the report.
func (sr *svgReport) p(format string, a ...any) { fmt.Fprintf(sr.bw, format, a...) }

// sum returns the requests of v in column c.
func (sr *svgReport) sum(v []int64, c int) int64 {
	var n int64
	for _, x := range v[c*sr.bucket : min((c+1)*sr.bucket, len(v))] {
		n += x
	}
	return n
}

// svgEscape returns s escaped for XML text and attributes.
func svgEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
	return b.String()
}

// svgNum formats a coordinate.
func svgNum(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }

// head writes the report's opening: its size, title, legend and the line
// that lists the series the traffic did not reach.
func (sr *svgReport) head(title string, r Result, reached, others []Series) {
	height := sr.top0 + len(reached)*(svgPanel+svgPanelGap) + 8
	unit := "a second"
	if sr.bucket > 1 {
		unit = "per " + strconv.Itoa(sr.bucket) + " s"
	}
	sr.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	sr.p("<title>sluice simulate: %s</title>\n", svgEscape(title))
	sr.p(`<rect width="100%%" height="100%%" fill="#fff"/>` + "\n")
	sr.p(`<text x="%d" y="20" font-size="14">%s</text>`+"\n", svgLeft, svgEscape(fmt.Sprintf("sluice simulate: %s (%d requests over %d s)", title, r.Requests, r.Seconds)))
	sr.p(`<text x="%d" y="40"><tspan fill="%s">■ admitted</tspan> <tspan fill="%s">■ denied</tspan> (requests %s)</text>`+"\n",
		svgLeft, admittedColour, deniedColour, unit)
	if len(others) == 0 {
		return
	}
	what := "Not reached (every request admitted; not charted): "
	if len(reached) == 0 {
		what = "The traffic reached no limit: "
	}
	names := make([]string, len(others))
	for i, s := range others {
		names[i] = fmt.Sprintf("%s (most in a period %d)", s.Name, s.MaxAdmittedWindow)
	}
	sr.p(`<text class="others" x="%d" y="%d" fill="#555">%s</text>`+"\n", svgLeft, svgTop+4, svgEscape(what+strings.Join(names, "; ")))
}

// panel writes the i-th panel, series s's, of a report of seconds
// seconds.
func (sr *svgReport) panel(i int, s Series, seconds int) {
	var adm, den int64
	for k := range s.Admitted {
		adm, den = adm+s.Admitted[k], den+s.Denied[k]
	}
	y0 := sr.top0 + i*(svgPanel+svgPanelGap) + 24 // the panel's top
	base := float64(y0 + svgPanel)
	sr.p(`<g class="series" data-limit="%s" data-admitted="%d" data-denied="%d">`+"\n", svgEscape(s.Limit), adm, den)
	sr.p(`<text x="%d" y="%d">%s</text>`+"\n", svgLeft, y0-8,
		svgEscape(fmt.Sprintf("%s: admitted %d, denied %d; most in a second %d, in one period %d", s.Name, adm, den, s.MaxAdmitted, s.MaxAdmittedWindow)))
	sr.p(`<rect x="%d" y="%d" width="%s" height="%d" fill="none" stroke="#ccc"/>`+"\n", svgLeft, y0, svgNum(sr.plotW), svgPanel)
	sr.p(`<text x="%d" y="%d" text-anchor="end">%d</text>`+"\n", svgLeft-6, y0+10, sr.top)
	sr.p(`<text x="%d" y="%s" text-anchor="end">0</text>`+"\n", svgLeft-6, svgNum(base))
	sr.p(`<text x="%d" y="%s">0 s</text>`+"\n", svgLeft, svgNum(base+16))
	sr.p(`<text x="%s" y="%s" text-anchor="end">%d s</text>`+"\n", svgNum(float64(svgLeft)+sr.plotW), svgNum(base+16), seconds)
	// The admitted columns stand on the baseline, the denied ones on the
	// admitted.
	admitted := func(c int) int64 { return sr.sum(s.Admitted, c) }
	sr.columns("admitted", admittedColour, base, func(int) int64 { return 0 }, admitted)
	sr.columns("denied", deniedColour, base, admitted, func(c int) int64 { return admitted(c) + sr.sum(s.Denied, c) })
	sr.p("</g>\n")
}

// columns writes the path of one kind of columns of a panel whose
// baseline is at base: each column from from(c) up to to(c). The path
// starts at the baseline's left end and, column by column, goes to its
// top (V) and across it (H), then back along the bottoms right to left.
func (sr *svgReport) columns(class, colour string, base float64, from, to func(c int) int64) {
	scale := float64(svgPanel) / float64(sr.top)
	sr.p(`<path class="%s" fill="%s" d="`, class, colour)
	sr.p("M%s %s", svgNum(float64(svgLeft)), svgNum(base-float64(from(0))*scale))
	for c := range sr.cols {
		sr.p(" V%s H%s", svgNum(base-float64(to(c))*scale), svgNum(float64(svgLeft)+float64(c+1)*sr.colW))
	}
	for c := sr.cols - 1; c >= 0; c-- {
		sr.p(" V%s H%s", svgNum(base-float64(from(c))*scale), svgNum(float64(svgLeft)+float64(c)*sr.colW))
	}
	sr.p(` Z"/>` + "\n")
}
