package regions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/store/memory"
)

// t0 is the instant the tests start at: the start of a minute.
var t0 = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)

// probeRate is the rate a memSite reads counts under: the count is what it
// does not leave.
const probeRate = 1 << 32

// memSite is a region's store in memory as a Site, on the test's clock:
// the counts are read from the region's memory store by a TakeAll of cost
// 0, the board is a map.
type memSite struct {
	t     testing.TB
	clock *clocktest.Clock
	store atomic.Pointer[memory.Store]

	mu      sync.Mutex
	board   map[string]memRecord
	inc     string             // the incarnation: a new one at each restart
	born    int64              // when the incarnation's first beat was, µs
	carried map[string]Carried // what its nodes carried of earlier incarnations, by key
	reads   atomic.Int64
	asked   atomic.Int64 // keys whose carried counts a read asked for
}

// TakeAll is the region's store's: what its nodes decide on.
func (m *memSite) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	return m.store.Load().TakeAll(ctx, reqs, ds)
}

// restart empties the site, as a Redis restarted without persistence:
// its counts and board are gone, its incarnation new.
func (m *memSite) restart() {
	m.store.Store(newMemory(m.t, m.clock))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.board = make(map[string]memRecord)
	m.inc, m.born = "", 0
	m.carried = nil
}

func newMemory(t testing.TB, clock *clocktest.Clock) *memory.Store {
	st, err := memory.New(memory.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

type memRecord struct {
	n   Node
	exp int64
}

func newMemSite(t testing.TB, clock *clocktest.Clock) *memSite {
	m := &memSite{t: t, clock: clock, board: make(map[string]memRecord)}
	m.store.Store(newMemory(t, clock))
	return m
}

func (m *memSite) Read(ctx context.Context, reqs []sluice.Request, carried []bool) (Reading, error) {
	m.reads.Add(1)
	probe := make([]sluice.Request, len(reqs))
	for i, r := range reqs {
		probe[i] = r
		probe[i].Cost = 0
		probe[i].Limit.Rate = probeRate
	}
	ds := make([]sluice.Decision, len(reqs))
	if len(reqs) > 0 {
		if err := m.store.Load().TakeAll(ctx, probe, ds); err != nil {
			return Reading{}, err
		}
	}
	r := Reading{Now: m.clock.Now().UnixMicro(), Counts: make([]int64, len(reqs))}
	for i := range ds {
		r.Counts[i] = probeRate - ds[i].Remaining
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r.Known, r.Incarnation, r.Born = len(m.board) > 0, m.inc, m.born
	for _, rec := range m.board {
		if rec.exp >= r.Now {
			r.Nodes = append(r.Nodes, rec.n)
		}
	}
	r.Carried = make([]Carried, len(reqs))
	for i, q := range reqs {
		if asked(carried, i) {
			m.asked.Add(1)
		}
		if c, ok := m.carried[q.Key]; ok && c.Until > r.Now && asked(carried, i) {
			r.Carried[i] = Carried{Window: c.Window, Count: c.Count}
		}
	}
	return r, nil
}

// Carry merges cs by maximum, as RedisSite's script does.
func (m *memSite) Carry(_ context.Context, cs []Carried) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.carried == nil {
		m.carried = make(map[string]Carried)
	}
	for _, c := range cs {
		old, ok := m.carried[c.Key]
		if ok && (old.Window > c.Window || old.Window == c.Window && old.Count >= c.Count) {
			continue
		}
		m.carried[c.Key] = c
	}
	return nil
}

func (m *memSite) Beat(_ context.Context, n Node, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n.Seen = clone(n.Seen)
	if m.inc == "" { // the first beat of a board sets its incarnation
		m.inc, m.born = fmt.Sprintf("inc-%d", m.clock.Now().UnixNano()), m.clock.Now().UnixMicro()
	}
	m.board[n.ID] = memRecord{n, m.clock.Now().Add(ttl).UnixMicro()}
	return nil
}

func clone(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

var errCut = errors.New("cut off")

// link is how one region reaches a site: while cut, it fails as a
// partition does. While slow, a read reads the site at once and answers
// when release is called (or its context ends): a read across a slow WAN,
// which answers after its round stopped waiting, and after rounds that
// began later. With lag set, a read answers with the site's counts of lag
// earlier, and its board as it is, as if they were fresh: the bound does
// not hold then (TestSimulationCatchesStaleReadings).
type link struct {
	to   *memSite
	cut  atomic.Bool
	slow atomic.Bool
	hang atomic.Bool // reads wait for release whatever their context says (a connection that hangs)
	lag  time.Duration

	mu      sync.Mutex
	held    []chan struct{} // the slow reads waiting for release
	late    atomic.Int64    // slow reads answered on release
	history []Reading       // with lag: the readings of the last lag and one before, oldest first
}

func (l *link) Read(ctx context.Context, reqs []sluice.Request, carried []bool) (Reading, error) {
	if l.cut.Load() {
		return Reading{}, errCut
	}
	r, err := l.to.Read(ctx, reqs, carried)
	if err != nil {
		return r, err
	}
	if l.lag > 0 {
		return l.lagged(r), nil
	}
	if !l.slow.Load() && !l.hang.Load() {
		return r, nil
	}
	ch := make(chan struct{})
	l.mu.Lock()
	l.held = append(l.held, ch)
	l.mu.Unlock()
	if l.hang.Load() {
		<-ch
		return r, nil
	}
	select {
	case <-ch:
		l.late.Add(1)
		return r, nil
	case <-ctx.Done():
		return Reading{}, ctx.Err()
	}
}

// lagged returns r with the clock and counts of the newest reading at
// least l.lag older than r, of as many keys (r itself when there is
// none), and keeps r.
func (l *link) lagged(r Reading) Reading {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := r
	keep := 0
	for i, h := range l.history {
		if time.Duration(r.Now-h.Now)*time.Microsecond >= l.lag {
			keep = i
			if len(h.Counts) == len(r.Counts) {
				out.Now, out.Counts = h.Now, h.Counts
			}
		}
	}
	l.history = append(l.history[keep:], r)
	return out
}

// release answers every slow read held so far.
func (l *link) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ch := range l.held {
		close(ch)
	}
	l.held = nil
}

func (l *link) Beat(ctx context.Context, n Node, ttl time.Duration) error {
	if l.cut.Load() {
		return errCut
	}
	return l.to.Beat(ctx, n, ttl)
}

func (l *link) Carry(ctx context.Context, cs []Carried) error {
	if l.cut.Load() {
		return errCut
	}
	return l.to.Carry(ctx, cs)
}

// world is R regions of N nodes each, on one fake clock, whose rounds the
// test runs (SyncInterval < 0).
type world struct {
	t     testing.TB
	clock *clocktest.Clock
	sites []*memSite
	links [][]*link  // links[a][b]: region a reaching region b's site
	nodes [][]*Store // nodes[a][i]
	scope sluice.Scope
}

func regionName(a int) string { return fmt.Sprintf("r%d", a) }

func newWorld(t testing.TB, regions, nodes int, tune func(*Config)) *world {
	w := &world{t: t, clock: clocktest.New(t0), scope: sluice.GlobalScope}
	for range regions {
		w.sites = append(w.sites, newMemSite(t, w.clock))
	}
	w.links = make([][]*link, regions)
	for a := range regions {
		for b := range regions {
			w.links[a] = append(w.links[a], &link{to: w.sites[b]})
		}
	}
	w.nodes = make([][]*Store, regions)
	for a := range regions {
		for i := range nodes {
			w.nodes[a] = append(w.nodes[a], w.node(a, i, tune))
		}
	}
	return w
}

func (w *world) node(a, i int, tune func(*Config)) *Store {
	cfg := Config{Region: regionName(a), Node: fmt.Sprintf("%s-%d", regionName(a), i), Home: w.links[a][a],
		SyncInterval: -1, Now: w.clock.Now}
	for b := range w.links[a] {
		if b != a {
			cfg.Peers = append(cfg.Peers, Peer{Name: regionName(b), Site: w.links[a][b]})
		}
	}
	if tune != nil {
		tune(&cfg)
	}
	s, err := New(w.sites[a], cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { s.Close() })
	return s
}

// sync runs a round on every node, region by region.
func (w *world) sync() {
	w.t.Helper()
	for _, ns := range w.nodes {
		for _, n := range ns {
			if err := n.Sync(context.Background()); err != nil && !errors.Is(err, errCut) {
				w.t.Fatal(err)
			}
		}
	}
}

// cutOff cuts region a from every other region, both ways, or heals it.
func (w *world) cutOff(a int, cut bool) {
	for b := range w.links {
		if b != a {
			w.links[a][b].cut.Store(cut)
			w.links[b][a].cut.Store(cut)
		}
	}
}

// take sends one request of cost to node n of region a, of the world's
// scope (global unless a test sets it), and returns its decision.
func (w *world) take(a, n int, key string, l sluice.Limit, cost int64) sluice.Decision {
	w.t.Helper()
	var d [1]sluice.Decision
	if err := w.nodes[a][n].TakeAll(context.Background(), []sluice.Request{{Key: key, Limit: l, Cost: cost, Scope: w.scope}}, d[:]); err != nil {
		w.t.Fatal(err)
	}
	return d[0]
}
