// Package shed is sluice's adaptive load shedding: a Gate in front of an
// upstream (the proxy's, or the handler behind the middleware) that
// measures it (latency, requests in flight, errors), keeps an adaptive
// limit on its concurrency (a Vegas-style law), and, when the upstream is
// saturated, sheds by priority: sheddable requests first, critical ones
// last, each waiting at most MaxWait. The law and the order of shedding:
// docs/protecting.md, "How the shedding limit moves".
package shed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Priority is the order in which requests are shed: Sheddable first,
// Critical last. The zero value is Sheddable; rules files' default is
// Default.
type Priority uint8

const (
	Sheddable Priority = iota
	Default
	Critical

	numPriorities = 3
)

var priorityNames = [numPriorities]string{"sheddable", "default", "critical"}

// String returns the priority's name in rules files.
func (p Priority) String() string {
	if int(p) < numPriorities {
		return priorityNames[p]
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// ParsePriority reads "critical", "default" (or "") and "sheddable".
func ParsePriority(s string) (Priority, error) {
	if s == "" {
		return Default, nil
	}
	for i, n := range priorityNames {
		if n == s {
			return Priority(i), nil
		}
	}
	return 0, fmt.Errorf("unknown priority %q (want critical, default or sheddable)", s)
}

// ErrShed is returned by Acquire for a request shed.
var ErrShed = errors.New("shed: upstream saturated")

// Config configures a Gate. A zero field means its default.
type Config struct {
	// InitialLimit is the limit before any measurement. Default 20.
	InitialLimit int
	// MinLimit and MaxLimit bound the limit. Defaults 1 and 1000.
	MinLimit, MaxLimit int
	// Alpha and Beta bound the requests queued at the upstream that the
	// law aims for: below Alpha the limit grows, above Beta it shrinks.
	// Defaults 2 and 4.
	Alpha, Beta int
	// ReservePercent of the limit is kept from sheddable requests.
	// Default 25. Negative: none kept.
	ReservePercent int
	// MaxWait is the longest a critical or default request waits for a
	// slot before it is shed. Default 1s. Negative: no request waits.
	MaxWait time.Duration
	// MaxWaiting bounds the requests waiting at once; past it, shed.
	// Default 1024.
	MaxWaiting int
	// MinRTTWindow is how long a measured minRTT is kept before it is
	// measured afresh. Default 1m.
	MinRTTWindow time.Duration
	// Now is the clock of latencies. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns what every zero field of a Config means.
func DefaultConfig() Config {
	return Config{
		InitialLimit:   20,          // a guess the first windows correct
		MinLimit:       1,           // never shut the upstream off
		MaxLimit:       1000,        // in flight at once
		Alpha:          2,           // queued requests: grow below
		Beta:           4,           // shrink above
		ReservePercent: 25,          // of the limit, kept for critical and default traffic
		MaxWait:        time.Second, // a queued request's longest wait
		MaxWaiting:     1024,        // waiting at once
		MinRTTWindow:   time.Minute, // then minRTT is measured again
		Now:            time.Now,
	}
}

// Gate admits, queues or sheds requests to one upstream. It is safe for
// concurrent use and starts no goroutines.
type Gate struct {
	cfg Config

	mu       sync.Mutex
	limit    float64
	inFlight int
	queues   [numPriorities][]*waiter // FIFO per priority
	waiting  int

	minRTT   time.Duration
	minAt    time.Time
	nextMin  time.Duration // least latency of the current MinRTTWindow
	winMin   time.Duration // least latency of the window
	winN     int
	winErr   int
	winPeak  int // most in flight during the window
	admitted [numPriorities]uint64
	shed     [numPriorities]uint64
	failed   uint64
}

type waiter struct {
	ch      chan struct{} // receives once when granted
	granted bool
}

// New returns a Gate for cfg.
func New(cfg Config) (*Gate, error) {
	def := DefaultConfig()
	if cfg.InitialLimit < 0 || cfg.MinLimit < 0 || cfg.MaxLimit < 0 || cfg.Alpha < 0 || cfg.Beta < 0 || cfg.MaxWaiting < 0 || cfg.MinRTTWindow < 0 {
		return nil, errors.New("shed: negative limits, bounds or window")
	}
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&cfg.InitialLimit, def.InitialLimit)
	set(&cfg.MinLimit, def.MinLimit)
	set(&cfg.MaxLimit, def.MaxLimit)
	set(&cfg.Alpha, def.Alpha)
	set(&cfg.Beta, def.Beta)
	set(&cfg.ReservePercent, def.ReservePercent)
	set(&cfg.MaxWaiting, def.MaxWaiting)
	if cfg.MaxWait == 0 {
		cfg.MaxWait = def.MaxWait
	}
	if cfg.MinRTTWindow == 0 {
		cfg.MinRTTWindow = def.MinRTTWindow
	}
	if cfg.Now == nil {
		cfg.Now = def.Now
	}
	switch {
	case cfg.MinLimit > cfg.MaxLimit:
		return nil, fmt.Errorf("shed: MinLimit %d above MaxLimit %d", cfg.MinLimit, cfg.MaxLimit)
	case cfg.Alpha > cfg.Beta:
		return nil, fmt.Errorf("shed: Alpha %d above Beta %d", cfg.Alpha, cfg.Beta)
	case cfg.ReservePercent > 100:
		return nil, fmt.Errorf("shed: ReservePercent %d above 100", cfg.ReservePercent)
	}
	g := &Gate{cfg: cfg, limit: float64(min(max(cfg.InitialLimit, cfg.MinLimit), cfg.MaxLimit))}
	return g, nil
}

// Ticket is an admitted request; Done reports how it went and frees its
// slot. The zero Ticket (from a nil Gate) does nothing.
type Ticket struct {
	g     *Gate
	start time.Time
}

// Acquire admits a request of priority p, waits for a slot, or sheds it
// (ErrShed). It returns ctx's error when ctx ends while it waits. A nil
// Gate admits every request.
func (g *Gate) Acquire(ctx context.Context, p Priority) (Ticket, error) {
	if g == nil {
		return Ticket{}, nil
	}
	if p >= numPriorities {
		p = Critical
	}
	g.mu.Lock()
	if g.admits(p) {
		g.admit(p)
		g.mu.Unlock()
		return Ticket{g: g, start: g.cfg.Now()}, nil
	}
	if p == Sheddable || g.cfg.MaxWait < 0 || g.waiting >= g.cfg.MaxWaiting {
		g.shed[p]++
		g.mu.Unlock()
		return Ticket{}, ErrShed
	}
	w := &waiter{ch: make(chan struct{}, 1)}
	g.queues[p] = append(g.queues[p], w)
	g.waiting++
	g.mu.Unlock()

	t := time.NewTimer(g.cfg.MaxWait)
	defer t.Stop()
	var err error
	select {
	case <-w.ch:
		return Ticket{g: g, start: g.cfg.Now()}, nil
	case <-t.C:
		err = ErrShed
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.granted { // granted as the wait ended: the slot is ours to use
		return Ticket{g: g, start: g.cfg.Now()}, nil
	}
	q := g.queues[p]
	for i := range q {
		if q[i] == w {
			g.queues[p] = append(q[:i], q[i+1:]...)
			break
		}
	}
	g.waiting--
	g.shed[p]++
	return Ticket{}, err
}

// admits reports whether a request of priority p goes in now.
func (g *Gate) admits(p Priority) bool {
	for q := p; q < numPriorities; q++ {
		if len(g.queues[q]) > 0 {
			return false // those before it go first
		}
	}
	limit := int(g.limit)
	if p == Sheddable && g.cfg.ReservePercent > 0 {
		limit -= (limit*g.cfg.ReservePercent + 99) / 100
	}
	return g.inFlight < limit
}

func (g *Gate) admit(p Priority) {
	g.inFlight++
	g.admitted[p]++
	g.winPeak = max(g.winPeak, g.inFlight)
}

// Done reports that the request ended, after its latency since Acquire;
// failed says the upstream failed it (a 5xx or no answer). It frees the
// slot for the oldest waiter of the highest priority. A client that left
// before the upstream answered is neither: pass the outcome as the
// upstream gave it, or call Drop.
func (t Ticket) Done(failed bool) {
	g := t.g
	if g == nil {
		return
	}
	rtt := g.cfg.Now().Sub(t.start)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sample(rtt, failed)
	g.release()
}

// Drop frees the slot without a measurement: the request ended for a
// reason that says nothing about the upstream.
func (t Ticket) Drop() {
	if t.g == nil {
		return
	}
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	t.g.release()
}

// release frees a slot and hands free slots to waiters, highest priority
// first, oldest first. g.mu is held.
func (g *Gate) release() {
	g.inFlight--
	for p := Critical; ; p-- {
		for len(g.queues[p]) > 0 && g.inFlight < int(g.limit) {
			w := g.queues[p][0]
			g.queues[p][0] = nil
			g.queues[p] = g.queues[p][1:]
			g.waiting--
			w.granted = true
			g.admit(p)
			w.ch <- struct{}{}
		}
		if p == 0 {
			return
		}
	}
}

// sample adds one latency to the window and, at the window's end,
// adjusts the limit. g.mu is held.
func (g *Gate) sample(rtt time.Duration, failed bool) {
	now := g.cfg.Now()
	if failed {
		g.winErr++
		g.failed++
	} else {
		rtt = max(rtt, time.Microsecond)
		if g.winN == 0 || rtt < g.winMin {
			g.winMin = rtt
		}
		g.winN++
		if g.nextMin == 0 || rtt < g.nextMin {
			g.nextMin = rtt
		}
		switch {
		case g.minRTT == 0 || rtt < g.minRTT:
			g.minRTT, g.minAt = rtt, now
		case now.Sub(g.minAt) >= g.cfg.MinRTTWindow:
			// Measure afresh: the least latency of the window just ended.
			g.minRTT, g.minAt, g.nextMin = g.nextMin, now, 0
		}
	}
	if g.winN+g.winErr < max(int(g.limit), 8) {
		return
	}
	limit := g.limit
	switch {
	case g.winErr*10 > g.winN+g.winErr:
		limit *= 0.9
	case g.winN > 0:
		queued := limit * (1 - float64(g.minRTT)/float64(g.winMin))
		switch {
		case queued < float64(g.cfg.Alpha) && g.winPeak*2 >= int(limit):
			limit++
		case queued > float64(g.cfg.Beta):
			limit -= max(1, (queued-float64(g.cfg.Beta))/2)
		}
	}
	g.limit = min(max(limit, float64(g.cfg.MinLimit)), float64(g.cfg.MaxLimit))
	g.winMin, g.winN, g.winErr, g.winPeak = 0, 0, 0, g.inFlight
	// A limit that grew may admit waiters now.
	if g.inFlight < int(g.limit) && g.waiting > 0 {
		g.inFlight++ // release takes one back
		g.release()
	}
}

// HasRoom reports whether the upstream has spare capacity now: whether
// the Gate would admit even a sheddable request at once (in flight below
// the limit less ReservePercent, nobody waiting). Elastic throttling asks
// it (decide.Request.Spare) before it lets a client past its own limit. A
// nil Gate always has room.
func (g *Gate) HasRoom() bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admits(Sheddable)
}

// Stats is a Gate's state, for metrics and readiness.
type Stats struct {
	Limit    int
	InFlight int
	Waiting  int
	MinRTT   time.Duration
	// Admitted and Shed count requests by priority (indexed by Priority)
	// since the Gate was made; Failed counts upstream failures.
	Admitted, Shed [numPriorities]uint64
	Failed         uint64
}

// Saturated reports whether the upstream is at its limit now.
func (s Stats) Saturated() bool { return s.InFlight >= s.Limit || s.Waiting > 0 }

// Stats returns the Gate's state now.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Limit: int(g.limit), InFlight: g.inFlight, Waiting: g.waiting, MinRTT: g.minRTT,
		Admitted: g.admitted, Shed: g.shed, Failed: g.failed}
}
