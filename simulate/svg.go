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
	plotW := float64(svgWidth - svgLeft - svgRight)
	colW := plotW / float64(cols)
	sum := func(v []int64, c int) int64 {
		var n int64
		for _, x := range v[c*bucket : min((c+1)*bucket, len(v))] {
			n += x
		}
		return n
	}
	reached, others := r.ReachedSeries()
	var top int64 = 1
	for _, s := range r.Series {
		for c := range cols {
			top = max(top, sum(s.Admitted, c)+sum(s.Denied, c))
		}
	}
	top0 := svgTop
	if len(others) > 0 {
		top0 += 20
	}
	height := top0 + len(reached)*(svgPanel+svgPanelGap) + 8
	unit := "a second"
	if bucket > 1 {
		unit = "per " + strconv.Itoa(bucket) + " s"
	}

	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	esc := func(s string) string {
		var b strings.Builder
		_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails
		return b.String()
	}
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	p("<title>sluice simulate: %s</title>\n", esc(title))
	p(`<rect width="100%%" height="100%%" fill="#fff"/>` + "\n")
	p(`<text x="%d" y="20" font-size="14">%s</text>`+"\n", svgLeft, esc(fmt.Sprintf("sluice simulate: %s (%d requests over %d s)", title, r.Requests, r.Seconds)))
	p(`<text x="%d" y="40"><tspan fill="%s">■ admitted</tspan> <tspan fill="%s">■ denied</tspan> (requests %s)</text>`+"\n",
		svgLeft, admittedColour, deniedColour, unit)
	if len(others) > 0 {
		what := "Not reached (every request admitted; not charted): "
		if len(reached) == 0 {
			what = "The traffic reached no limit: "
		}
		names := make([]string, len(others))
		for i, s := range others {
			names[i] = fmt.Sprintf("%s (most in a period %d)", s.Name, s.MaxAdmittedWindow)
		}
		p(`<text class="others" x="%d" y="%d" fill="#555">%s</text>`+"\n", svgLeft, svgTop+4, esc(what+strings.Join(names, "; ")))
	}
	for i, s := range reached {
		var adm, den int64
		for k := range s.Admitted {
			adm, den = adm+s.Admitted[k], den+s.Denied[k]
		}
		y0 := top0 + i*(svgPanel+svgPanelGap) + 24 // the panel's top
		base := float64(y0 + svgPanel)
		scale := float64(svgPanel) / float64(top)
		p(`<g class="series" data-limit="%s" data-admitted="%d" data-denied="%d">`+"\n", esc(s.Limit), adm, den)
		p(`<text x="%d" y="%d">%s</text>`+"\n", svgLeft, y0-8,
			esc(fmt.Sprintf("%s: admitted %d, denied %d; most in a second %d, in one period %d", s.Name, adm, den, s.MaxAdmitted, s.MaxAdmittedWindow)))
		p(`<rect x="%d" y="%d" width="%s" height="%d" fill="none" stroke="#ccc"/>`+"\n", svgLeft, y0, num(plotW), svgPanel)
		p(`<text x="%d" y="%d" text-anchor="end">%d</text>`+"\n", svgLeft-6, y0+10, top)
		p(`<text x="%d" y="%s" text-anchor="end">0</text>`+"\n", svgLeft-6, num(base))
		p(`<text x="%d" y="%s">0 s</text>`+"\n", svgLeft, num(base+16))
		p(`<text x="%s" y="%s" text-anchor="end">%d s</text>`+"\n", num(float64(svgLeft)+plotW), num(base+16), r.Seconds)
		// Each path starts at the baseline's left end and, column by
		// column, goes to its top (V) and across it (H); the admitted
		// columns stand on the baseline, the denied ones on the
		// admitted.
		for _, kind := range []struct {
			class, colour string
			from, to      func(c int) int64
		}{
			{"admitted", admittedColour, func(int) int64 { return 0 }, func(c int) int64 { return sum(s.Admitted, c) }},
			{"denied", deniedColour, func(c int) int64 { return sum(s.Admitted, c) }, func(c int) int64 { return sum(s.Admitted, c) + sum(s.Denied, c) }},
		} {
			p(`<path class="%s" fill="%s" d="`, kind.class, kind.colour)
			// The outline: along the tops left to right, back along
			// the bottoms right to left.
			p("M%s %s", num(float64(svgLeft)), num(base-float64(kind.from(0))*scale))
			for c := range cols {
				p(" V%s H%s", num(base-float64(kind.to(c))*scale), num(float64(svgLeft)+float64(c+1)*colW))
			}
			for c := cols - 1; c >= 0; c-- {
				p(" V%s H%s", num(base-float64(kind.from(c))*scale), num(float64(svgLeft)+float64(c)*colW))
			}
			p(` Z"/>` + "\n")
		}
		p("</g>\n")
	}
	p("</svg>\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("svg report: %w", err)
	}
	return nil
}
