package weather

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	fullMatrix = flag.Bool("weather.full", false, "run the full matrix (every weather, one server and three) and print its table")
	tableOut   = flag.String("weather.out", "", "also write the table to this file")
)

// The figures of issue 31, which every row must reach.
const (
	// maxUnderDenied is the largest share of the calls of clients under
	// their limit that may be denied.
	maxUnderDenied = 0.001
	// maxBack is the longest the servers may go on deciding without the
	// store after the weather ends (asserted in the full matrix only: a
	// timed figure, which a loaded CI machine must not fail).
	maxBack = time.Second
	// backBin is the resolution of the time back to the store.
	backBin = 250 * time.Millisecond
)

// overBound is the most a client over its limit of limit a window may be
// admitted beyond it in one window, in mode on servers servers, as
// docs/stores.md states the bound of the servers deciding without the
// store: a twentieth of the limit (what a server had not yet learned of a
// key's count) and one a server (the rounding of their shares), in
// lease mode besides each server's outstanding lease (at most
// min(--max-lease 1000, limit/16)), in async mode what each other server
// admitted since its last sync landed or may still admit from its
// allowance, which a deciding server's count leaves out (at most two
// allowances, each at most max(⌊limit/(50 × servers)⌋, 1)); on one server
// never more than a tenth of the limit, issue 31's figure.
func overBound(mode string, servers, limit int) int {
	b := limit/20 + servers
	switch mode {
	case "lease":
		b += servers * min(1000, limit/16)
	case "async":
		b += (servers - 1) * 2 * max(limit/(50*servers), 1)
	}
	if servers == 1 {
		b = min(b, limit/10)
	}
	return b
}

// cell is one weather × topology × mode's measurement.
type cell struct {
	weather              string
	servers              int
	mode                 string
	underCalls, underDen int
	overSent, overAdm    int
	overAllowed, limit   int
	errors               int
	// back is when, after the weather's end, every server decided by the
	// store again: the end of the last quarter second (of those from the
	// weather's end) in which the store did not decide more than half of
	// a server's calls; 0: none such. last is the last call sent after
	// the end that the store did not decide (-1: none), which a loaded
	// machine's slow store call can make at any time.
	back, last time.Duration
	notBack    bool // back is within the run's last second
	fails      map[string]int
}

// TestWeather runs the matrix: the short one by default, the full one
// with -weather.full. Each run starts its own Redis, proxy and servers.
func TestWeather(t *testing.T) {
	p := shortPlan()
	if *fullMatrix {
		p = fullPlan()
	}
	var cells []cell
	for _, wx := range weathers {
		d := wx.short
		tops := wx.shortServers
		if *fullMatrix {
			d, tops = wx.full, []int{1, 3}
		}
		if d == 0 {
			continue
		}
		for _, n := range tops {
			t.Run(fmt.Sprintf("%s/%d", strings.ReplaceAll(wx.name, " ", "_"), n), func(t *testing.T) {
				got := measure(t, wx, n, d, p)
				for _, c := range got {
					check(t, c)
				}
				cells = append(cells, got...)
			})
		}
	}
	table := markdown(cells, p)
	t.Logf("\n%s", table)
	if *tableOut != "" {
		if err := os.WriteFile(*tableOut, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// measure runs one weather of length d on n servers under p's load.
func measure(t *testing.T, wx weather, n int, d time.Duration, p plan) []cell {
	w := newWorld(t, n, p)
	total := p.warm + d + p.after
	l := &load{w: w}
	started := make(chan time.Time, 1)
	done := make(chan []call, 1)
	go func() { done <- l.run(p, total, started) }()
	start := <-started
	time.Sleep(time.Until(start.Add(p.warm))) // the weather's start on the load's timeline
	wx.apply(w, d)
	end := time.Since(start)
	calls := <-done
	var cells []cell
	for m, mode := range modes {
		cells = append(cells, summarize(calls, m, wx.name, n, mode, end, total, start, p))
	}
	for i, s := range w.servers {
		t.Logf("server %d /readyz fail_decisions after the run: %v", i, s.failDecisions())
	}
	return cells
}

// summarize measures mode m's calls of a run whose weather ended at end.
func summarize(calls []call, m int, name string, n int, mode string, end, total time.Duration, start time.Time, p plan) cell {
	c := cell{weather: name, servers: n, mode: mode, limit: p.overLimit, fails: map[string]int{}, last: -1}
	type bin struct{ server, i int }
	inBin, localInBin := map[bin]int{}, map[bin]int{}
	var first, last time.Duration = total, 0
	for _, k := range calls {
		if k.mode != m {
			continue
		}
		if k.err {
			c.errors++
			continue
		}
		if k.sent >= end {
			b := bin{k.server, int((k.sent - end) / backBin)}
			inBin[b]++
			if k.fail != "" {
				localInBin[b]++
				c.last = max(c.last, k.sent-end)
			}
		}
		if k.fail != "" {
			c.fails[k.fail]++
		}
		if k.over {
			c.overSent++
			first, last = min(first, k.sent), max(last, k.sent)
			if k.admitted {
				c.overAdm++
			}
			continue
		}
		c.underCalls++
		if !k.admitted {
			c.underDen++
		}
	}
	// Windows of the hourly limit the client's calls touched: a run across
	// the hour may be admitted the limit in each.
	windows := int(start.Add(last).Truncate(time.Hour).Sub(start.Add(first).Truncate(time.Hour))/time.Hour) + 1
	c.overAllowed = windows * (p.overLimit + overBound(mode, n, p.overLimit))
	if strings.HasPrefix(name, "restart") && n > 1 {
		// docs/stores.md, "When the store restarts empty": besides, one
		// allowance for each server that syncs on the empty count before
		// the counts put back land; here a hit a server, the least one.
		c.overAllowed += n
	}
	for b, nl := range localInBin {
		if 2*nl > inBin[b] {
			c.back = max(c.back, time.Duration(b.i+1)*backBin)
		}
	}
	c.notBack = c.back > 0 && total-end-c.back < time.Second
	return c
}

// check asserts the figures of issue 31 on c.
func check(t *testing.T, c cell) {
	t.Helper()
	for _, v := range verdicts(c) {
		if !v.ok && (!v.timed || *fullMatrix) {
			t.Errorf("%s, %d server(s), %s: %s", c.weather, c.servers, c.mode, v.what)
		}
	}
}

// verdict is one figure of a cell, reached or not.
type verdict struct {
	ok    bool
	timed bool // a figure of time, asserted in the full matrix only
	what  string
}

func verdicts(c cell) []verdict {
	share := 0.0
	if c.underCalls > 0 {
		share = float64(c.underDen) / float64(c.underCalls)
	}
	// The figure in whole calls, rounded down, and at least one: the
	// short matrix's 600 calls cannot tell 0.1% (0.6 of a call) from none,
	// so one denial there is within it; the full matrix's 1,400-3,400
	// allow 1-3.
	under := max(int(maxUnderDenied*float64(c.underCalls)), 1)
	return []verdict{
		{ok: c.underDen <= under, what: fmt.Sprintf("clients under their limit: %d of %d calls denied (%.2f%%), want at most %.1f%% (%d)",
			c.underDen, c.underCalls, 100*share, 100*maxUnderDenied, under)},
		{ok: c.overAdm <= c.overAllowed, what: fmt.Sprintf("a client over its limit of %d an hour: %d admitted, want at most %d",
			c.limit, c.overAdm, c.overAllowed)},
		{ok: c.errors == 0, what: fmt.Sprintf("%d calls failed, want none", c.errors)},
		{ok: !c.notBack && c.back <= maxBack, timed: true, what: fmt.Sprintf("back to the store %s after the weather, want within %v",
			backText(c), maxBack)},
	}
}

func backText(c cell) string {
	switch {
	case c.notBack:
		return "not by the run's end"
	case c.last < 0:
		return "at once"
	case c.back == 0:
		return fmt.Sprintf("at once (last %.2fs)", c.last.Seconds())
	default:
		return fmt.Sprintf("%.2fs (last %.2fs)", c.back.Seconds(), c.last.Seconds())
	}
}

// markdown is the matrix's table.
func markdown(cells []cell, p plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Each mode at once on its own keys: %d clients at %.0f a second under a limit of %d a second, "+
		"one client sending %.0f× a limit of %d an hour, half the limit before the weather (which starts after %v) and the rest while it lasts and %v after.\n\n",
		p.underClients, p.underRate, p.underLimit, p.overTimes, p.overLimit, p.warm, p.after)
	b.WriteString("| weather | servers | mode | under-limit calls denied | over-limit client admitted (allowed) | errors | back to the store | not decided by the store | figures |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range cells {
		var missed []string
		for i, v := range verdicts(c) {
			if !v.ok {
				missed = append(missed, []string{"under", "over", "errors", "back"}[i])
			}
		}
		fig := "all reached"
		if len(missed) > 0 {
			fig = "**missed: " + strings.Join(missed, ", ") + "**"
		}
		var fails []string
		for _, k := range slices.Sorted(maps.Keys(c.fails)) {
			fails = append(fails, fmt.Sprintf("%s %d", k, c.fails[k]))
		}
		if len(fails) == 0 {
			fails = []string{"none"}
		}
		share := 0.0
		if c.underCalls > 0 {
			share = 100 * float64(c.underDen) / float64(c.underCalls)
		}
		// Not a figure of issue 31, but a client's first calls up to its
		// limit are those of a client under it: a shortfall is shown.
		short := ""
		if c.overAdm < c.limit*9/10 {
			short = fmt.Sprintf(", %d under its limit", c.limit-c.overAdm)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d of %d (%.2f%%) | %d of %d sent (≤ %d%s) | %d | %s | %s | %s |\n",
			c.weather, c.servers, c.mode, c.underDen, c.underCalls, share, c.overAdm, c.overSent, c.overAllowed, short,
			c.errors, backText(c), strings.Join(fails, ", "), fig)
	}
	b.WriteString("\nThe weathers, each for the time given:\n\n")
	seen := map[string]bool{}
	for _, c := range cells {
		if seen[c.weather] {
			continue
		}
		seen[c.weather] = true
		for _, wx := range weathers {
			if wx.name == c.weather {
				d := wx.short
				if *fullMatrix {
					d = wx.full
				}
				fmt.Fprintf(&b, "- %s (%v): %s\n", wx.name, d, wx.what)
			}
		}
	}
	return b.String()
}
