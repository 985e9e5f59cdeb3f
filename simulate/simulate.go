// Package simulate plays a traffic pattern against limits with sluice's
// own algorithms (sluice.Limit.Take) on a simulated clock, and counts what
// each admits and denies per second, so that a rule can be seen at work
// before it is deployed: a fixed window's burst at its boundary beside a
// sliding window's smoothing, say.
package simulate

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Caps on what a simulation may ask for: DefaultCaps' (sluice simulate's),
// and those of every Caps.
const (
	MaxEvents   = 1_000_000      // requests in a traffic pattern
	MaxDuration = 24 * time.Hour // how long a pattern lasts
	MaxKeys     = 10_000         // distinct clients
	MaxTargets  = 32             // limits simulated side by side
	MaxSpecLen  = 4096           // bytes of a traffic spec
	MaxRate     = 100_000        // requests a second of a phase
)

// Caps bound a simulation's cost: its CPU time grows with Events ×
// Limits, its memory with Events, Keys and Duration × Limits (the
// per-second series) and a sliding_log's hits. A zero field means
// DefaultCaps'; none may exceed it.
type Caps struct {
	Events   int           // requests in a pattern
	Duration time.Duration // how long a pattern lasts
	Keys     int           // distinct clients
	Limits   int           // limits simulated side by side
}

// DefaultCaps are the caps of sluice simulate, whose user pays for it: a
// million requests, a day, 10,000 clients, 32 limits.
var DefaultCaps = Caps{Events: MaxEvents, Duration: MaxDuration, Keys: MaxKeys, Limits: MaxTargets}

// WebCaps are the caps of the dashboard's simulator, which anyone who
// reaches it may call: 50,000 requests, an hour, 1,000 clients, 8 limits.
// A call of the most they allow costs about 0.1 s of CPU and 9 MB
// allocated (TestWebCapsCost in package ui measures it).
var WebCaps = Caps{Events: 50_000, Duration: time.Hour, Keys: 1000, Limits: 8}

// withDefaults returns c with each zero field DefaultCaps', and each above
// it lowered to it.
func (c Caps) withDefaults() Caps {
	d := DefaultCaps
	pick := func(v, def int) int {
		if v <= 0 || v > def {
			return def
		}
		return v
	}
	c.Events, c.Keys, c.Limits = pick(c.Events, d.Events), pick(c.Keys, d.Keys), pick(c.Limits, d.Limits)
	if c.Duration <= 0 || c.Duration > d.Duration {
		c.Duration = d.Duration
	}
	return c
}

// Start is the simulated clock's first instant: the start of a day, so
// that windows of a second, a minute or an hour begin with the pattern, as
// Envoy's fixed windows are aligned to their unit.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Event is one request at At after Start from client Key.
type Event struct {
	At  time.Duration
	Key string
}

// Pattern is a traffic pattern: its requests in time order, and how long it
// lasts (a trailing idle phase included; at least to its last request).
type Pattern struct {
	Events []Event
	Length time.Duration
}

// ErrSpec is wrapped by the errors of ParseTraffic and ParseLog.
var ErrSpec = errors.New("traffic")

// ParseTraffic reads a traffic pattern: phases separated by ';', played
// one after the other from the clock's start, each one of
//
//	steady RATE DURATION      RATE requests a second (10/s, 600/m, 3600/h) for DURATION (30s, 5m)
//	ramp FROM TO DURATION     the rate growing evenly from FROM to TO over DURATION
//	burst N                   N requests at once
//	idle DURATION             nothing for DURATION
//	clients N                 the phases after it spread their requests over N clients in turn (default 1)
//
// such as "steady 1/s 50s; burst 100; idle 1s; burst 100", within
// DefaultCaps.
func ParseTraffic(spec string) (Pattern, error) { return DefaultCaps.ParseTraffic(spec) }

// ParseTraffic reads a traffic pattern as the package's ParseTraffic
// does, within c.
func (c Caps) ParseTraffic(spec string) (Pattern, error) {
	c = c.withDefaults()
	if len(spec) > MaxSpecLen {
		return Pattern{}, fmt.Errorf("%w: spec longer than %d bytes", ErrSpec, MaxSpecLen)
	}
	tp := &trafficParser{c: c, clients: 1}
	for i, ph := range strings.Split(spec, ";") {
		f := strings.Fields(ph)
		if len(f) == 0 {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: phase %d %q: %s", ErrSpec, i+1, strings.TrimSpace(ph), fmt.Sprintf(format, a...))
		}
		want := map[string]int{"steady": 3, "ramp": 4, "burst": 2, "idle": 2, "clients": 2}[f[0]]
		if want == 0 {
			return Pattern{}, bad("want steady, ramp, burst, idle or clients")
		}
		if len(f) != want {
			return Pattern{}, bad("want %d words", want)
		}
		if err := tp.phase(f, bad); err != nil {
			return Pattern{}, err
		}
	}
	if len(tp.evs) == 0 {
		return Pattern{}, fmt.Errorf("%w: no requests", ErrSpec)
	}
	return Pattern{Events: tp.evs, Length: tp.at}, nil
}

// trafficParser is ParseTraffic's pattern being read: the requests so
// far, the time the next phase starts, and the clients they go to.
type trafficParser struct {
	c       Caps
	evs     []Event
	at      time.Duration
	clients int
	next    int
	names   []string // the clients' keys, made once each
}

// phase reads one phase, f (its words, as many as its kind takes); bad
// makes the error that names the phase.
func (tp *trafficParser) phase(f []string, bad func(format string, a ...any) error) error {
	c := tp.c
	switch f[0] {
	case "steady", "ramp":
		from, err1 := parseRate(f[1])
		to, err := from, error(nil)
		if f[0] == "ramp" {
			to, err = parseRate(f[2])
		}
		d, err2 := parseDuration(f[len(f)-1])
		if err = cmp.Or(err1, err, err2); err != nil {
			return bad("%v", err)
		}
		if tp.at+d > c.Duration {
			return bad("the pattern lasts more than %v", c.Duration)
		}
		return tp.rate(from, to, d)
	case "burst", "clients":
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > c.Events {
			return bad("want a count from 1 to %d", c.Events)
		}
		if f[0] == "clients" {
			if n > c.Keys {
				return bad("at most %d clients", c.Keys)
			}
			tp.clients = n
			return nil
		}
		for range n {
			if err := tp.emit(tp.at); err != nil {
				return err
			}
		}
	case "idle":
		d, err := parseDuration(f[1])
		if err != nil {
			return bad("%v", err)
		}
		if tp.at += d; tp.at > c.Duration {
			return bad("the pattern lasts more than %v", c.Duration)
		}
	}
	return nil
}

// rate emits the requests of a phase of d whose rate grows evenly from
// from to to (a second): its first request comes at its start, the k+1-th
// when the rate's integral reaches k, found in steps of a millisecond, or
// a 100,000th of a longer phase (the tolerance absorbs the sum's
// rounding).
func (tp *trafficParser) rate(from, to float64, d time.Duration) error {
	acc := 1.0
	step := max(time.Millisecond, d/100_000)
	for t := time.Duration(0); t < d; t += step {
		for ; acc >= 1-1e-9; acc-- {
			if err := tp.emit(tp.at + t); err != nil {
				return err
			}
		}
		r := from + (to-from)*float64(t)/float64(d)
		acc += r * step.Seconds()
	}
	tp.at += d
	return nil
}

// emit adds a request at t, from the next client in turn.
func (tp *trafficParser) emit(t time.Duration) error {
	if len(tp.evs) >= tp.c.Events {
		return fmt.Errorf("%w: more than %d requests", ErrSpec, tp.c.Events)
	}
	i := tp.next % tp.clients
	for len(tp.names) <= i {
		tp.names = append(tp.names, "client-"+strconv.Itoa(len(tp.names)+1))
	}
	tp.evs = append(tp.evs, Event{At: t, Key: tp.names[i]})
	tp.next++
	return nil
}

func parseRate(s string) (float64, error) {
	n, unit, ok := strings.Cut(s, "/")
	per := map[string]float64{"s": 1, "m": 60, "h": 3600}[unit]
	r, err := strconv.ParseFloat(n, 64)
	if !ok || per == 0 || err != nil || r < 0 || math.IsNaN(r) || r/per > MaxRate {
		return 0, fmt.Errorf("rate %q: want N/s, N/m or N/h, at most %d a second", s, MaxRate)
	}
	return r / per, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxDuration {
		return 0, fmt.Errorf("duration %q: want 1ms to %v, such as 30s", s, MaxDuration)
	}
	return d, nil
}

// ParseLog reads a recorded log of requests, one a line: the seconds since
// the log's start (a decimal number) and, optionally after a space or a
// comma, the client's key. Blank lines and lines starting with # are
// skipped. The events are sorted by time; the pattern ends with the last.
func ParseLog(r io.Reader) (Pattern, error) {
	var evs []Event
	keys := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		ts, key, _ := strings.Cut(strings.Replace(line, ",", " ", 1), " ")
		sec, err := strconv.ParseFloat(ts, 64)
		if err != nil || sec < 0 || sec > MaxDuration.Seconds() {
			return Pattern{}, fmt.Errorf("%w: line %d: time %q: want seconds from 0 to %v", ErrSpec, n, ts, MaxDuration.Seconds())
		}
		key = cmp.Or(strings.TrimSpace(key), "client-1")
		if k, ok := keys[key]; ok {
			key = k
		} else if len(keys) >= MaxKeys {
			return Pattern{}, fmt.Errorf("%w: line %d: more than %d clients", ErrSpec, n, MaxKeys)
		} else {
			keys[key] = key
		}
		if len(evs) >= MaxEvents {
			return Pattern{}, fmt.Errorf("%w: line %d: more than %d requests", ErrSpec, n, MaxEvents)
		}
		evs = append(evs, Event{At: time.Duration(sec * float64(time.Second)), Key: key})
	}
	if err := sc.Err(); err != nil {
		return Pattern{}, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	if len(evs) == 0 {
		return Pattern{}, fmt.Errorf("%w: no requests", ErrSpec)
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return Pattern{Events: evs, Length: evs[len(evs)-1].At}, nil
}

// Target is a limit to simulate, and its name in the report. Group is the
// index of the rules' limit it plays (its own or under another algorithm).
type Target struct {
	Name  string
	Limit sluice.Limit
	Group int
}

// Targets returns a Target for each limit of set (every domain, in file
// order; unlimited and blocking limits left out) as the rules enforce it
// (soft throttling included) and, for each of algorithms, the same rate
// and period under that algorithm, so that they can be compared; at most
// DefaultCaps.Limits.
func Targets(set *rules.Set, algorithms ...sluice.Algorithm) ([]Target, error) {
	return DefaultCaps.Targets(set, algorithms...)
}

// Targets is the package's Targets, at most c.Limits of them.
func (c Caps) Targets(set *rules.Set, algorithms ...sluice.Algorithm) ([]Target, error) {
	c = c.withDefaults()
	var ts []Target
	group := -1
	var walk func(rs []*rules.Rule)
	walk = func(rs []*rules.Rule) {
		for _, r := range rs {
			for _, l := range r.Limits {
				if l.Unlimited || l.Block {
					continue
				}
				if len(ts) > c.Limits {
					return // refused below: no more names made
				}
				el := l.Enforced()
				group++
				ts = append(ts, Target{Name: fmt.Sprintf("%s %s", r.Path, el), Limit: el, Group: group})
				for _, a := range algorithms {
					if a == el.Algorithm {
						continue
					}
					al := el
					al.Algorithm = a
					if !a.HasBurst() {
						al.Burst = 0
					}
					if a != sluice.SlidingWindow {
						al.Precision = 0
					}
					if al.Validate() == nil {
						ts = append(ts, Target{Name: fmt.Sprintf("%s %s", r.Path, al), Limit: al, Group: group})
					}
				}
			}
			walk(r.Descriptors)
		}
	}
	for _, d := range set.Domains() {
		walk(set.Rules(d))
	}
	if len(ts) == 0 {
		return nil, errors.New("the rules have no limit to simulate")
	}
	if len(ts) > c.Limits {
		return nil, fmt.Errorf("the rules and algorithms make more than %d limits to simulate", c.Limits)
	}
	return ts, nil
}

// Series is what one Target admitted and denied in each second of the
// pattern.
type Series struct {
	Name     string  `json:"name"`
	Limit    string  `json:"limit"`
	Admitted []int64 `json:"admitted"`
	Denied   []int64 `json:"denied"`
	// MaxAdmitted is the most admitted in any one second, and
	// MaxAdmittedWindow the most admitted in any span of the limit's
	// period (to the second): above the rate, the boundary burst of a
	// fixed window.
	MaxAdmitted       int64 `json:"max_admitted"`
	MaxAdmittedWindow int64 `json:"max_admitted_window"`
	// Group is the Target's Group. Reached says the traffic reached the
	// limit of a Series of the group: a client's request was denied, or
	// left it nothing (Decision.Remaining 0). A report charts the groups
	// reached and lists the others.
	Group   int  `json:"group"`
	Reached bool `json:"reached"`
}

// Result is a simulation's outcome: one Series per Target, each of
// Seconds seconds. Step is the seconds a report's column adds up
// (StepFor), so that a long pattern makes at most MaxColumns columns.
type Result struct {
	Seconds  int      `json:"seconds"`
	Step     int      `json:"step"`
	Requests int      `json:"requests"`
	Series   []Series `json:"series"`
}

// MaxColumns is the most columns a report's chart draws.
const MaxColumns = 120

// steps are the seconds a column may add up, from the least.
var steps = []int{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200}

// StepFor returns the seconds each column of a chart of seconds seconds
// adds up: the least of 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min,
// 1 and 2 h that makes at most MaxColumns columns.
func StepFor(seconds int) int {
	for _, st := range steps {
		if (seconds+st-1)/st <= MaxColumns {
			return st
		}
	}
	return (seconds + MaxColumns - 1) / MaxColumns
}

// Run plays p against each target, every client with its own state, and
// counts per second from Start, for the whole of p's Length. The events
// must be in time order.
func Run(p Pattern, targets []Target) Result {
	events := p.Events
	secs := max(1, int((p.Length+time.Second-1)/time.Second))
	if n := len(events); n > 0 {
		secs = max(secs, int(events[n-1].At/time.Second)+1)
	}
	res := Result{Seconds: secs, Step: StepFor(secs), Requests: len(events)}
	reached := map[int]bool{}
	for _, t := range targets {
		s := Series{Name: t.Name, Limit: t.Limit.String(), Group: t.Group, Admitted: make([]int64, secs), Denied: make([]int64, secs)}
		states := map[string]*sluice.State{}
		for _, e := range events {
			st := states[e.Key]
			if st == nil {
				st = new(sluice.State)
				states[e.Key] = st
			}
			sec := int(e.At / time.Second)
			d := t.Limit.Take(st, Start.Add(e.At), 1)
			if d.Allowed {
				s.Admitted[sec]++
			} else {
				s.Denied[sec]++
			}
			if !d.Allowed || d.Remaining == 0 {
				reached[t.Group] = true
			}
		}
		w := max(1, int(t.Limit.Period/time.Second))
		var run int64
		for i, a := range s.Admitted {
			s.MaxAdmitted = max(s.MaxAdmitted, a)
			run += a
			if i >= w {
				run -= s.Admitted[i-w]
			}
			s.MaxAdmittedWindow = max(s.MaxAdmittedWindow, run)
		}
		res.Series = append(res.Series, s)
	}
	for i := range res.Series {
		res.Series[i].Reached = reached[res.Series[i].Group]
	}
	return res
}

// ReachedSeries returns the Series of r the traffic reached (Reached), and
// the others.
func (r Result) ReachedSeries() (reached, others []Series) {
	for _, s := range r.Series {
		if s.Reached {
			reached = append(reached, s)
		} else {
			others = append(others, s)
		}
	}
	return reached, others
}
