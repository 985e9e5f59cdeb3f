// Package sketch finds the heavy hitters of a stream in memory fixed by
// configuration, whatever the number of distinct values: a count-min sketch
// with conservative update counts every value, and a small table of
// candidates per time slot remembers the values whose estimates were the
// largest. A Counter keeps two rings of slots, so that it answers for the
// last minute and the last hour.
//
// The error bound is the count-min sketch's: an estimate is never below
// the value's true count in the window, and with probability at least
// 1 - e^-Depth it is at most the true count plus e/Width times the
// window's total (Counter.Top returns that bound). A value that was never
// among a slot's TopK largest estimates is not listed even if its total
// over the window would rank it: the candidates are per slot.
package sketch

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Config sizes a Counter. A zero field means its default.
type Config struct {
	// Width is the number of counters in each row of a sketch, rounded up
	// to a power of two: the error bound is e/Width of the window's total.
	// Default 1024 (0.27%).
	Width int
	// Depth is the number of rows: the bound holds with probability
	// 1 - e^-Depth. Default 4 (98.2%).
	Depth int
	// TopK is the number of candidates each slot keeps. Default 16.
	TopK int
	// ValueBytes is how much of a value a candidate keeps to show it;
	// longer values are cut (Hit.Truncated). Default 64.
	ValueBytes int
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Width:      1024, // e/1024: 0.27% of the window's total
		Depth:      4,    // bound holds with probability 1 - e^-4 = 98.2%
		TopK:       16,   // candidates per slot, more than a dashboard lists
		ValueBytes: 64,   // an IPv6 address or a user ID in full
	}
}

// Caps on Config, so that a mistaken flag cannot ask for gigabytes.
const (
	MaxWidth      = 1 << 20
	MaxDepth      = 16
	MaxTopK       = 1024
	MaxValueBytes = 255 // a candidate's length is a byte
)

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Width == 0 {
		c.Width = d.Width
	}
	if c.Depth == 0 {
		c.Depth = d.Depth
	}
	if c.TopK == 0 {
		c.TopK = d.TopK
	}
	if c.ValueBytes == 0 {
		c.ValueBytes = d.ValueBytes
	}
	switch {
	case c.Width < 1 || c.Width > MaxWidth:
		return c, fmt.Errorf("sketch width %d: want 1 to %d", c.Width, MaxWidth)
	case c.Depth < 1 || c.Depth > MaxDepth:
		return c, fmt.Errorf("sketch depth %d: want 1 to %d", c.Depth, MaxDepth)
	case c.TopK < 1 || c.TopK > MaxTopK:
		return c, fmt.Errorf("sketch top-k %d: want 1 to %d", c.TopK, MaxTopK)
	case c.ValueBytes < 1 || c.ValueBytes > MaxValueBytes:
		return c, fmt.Errorf("sketch value bytes %d: want 1 to %d", c.ValueBytes, MaxValueBytes)
	}
	c.Width = 1 << bits.Len(uint(c.Width-1))
	return c, nil
}

// The windows a Counter answers for. Each is a ring of slots; a window
// covers the slot now is in and the slots before it, so its span is
// between (slots-1) and slots times the slot length: the last minute is
// 50 to 60 seconds, the last hour 50 to 60 minutes.
const (
	Minute = time.Minute
	Hour   = time.Hour

	fineSlot    = 10 * time.Second
	coarseSlot  = 10 * time.Minute
	slotsPerWin = 6
)

// ErrWindow is returned by Top for a window other than Minute and Hour.
var ErrWindow = errors.New("window must be 1m or 1h")

// Hit is one value and its estimated count.
type Hit struct {
	Value     string
	Count     uint64
	Truncated bool // Value is the first ValueBytes bytes of a longer value
}

// Top is the answer of Counter.Top.
type Top struct {
	Hits []Hit
	// Total is the count of every value in the window.
	Total uint64
	// ErrorBound is the most an estimate exceeds the true count, with
	// probability Confidence: ceil(e/Width x Total). Estimates are never
	// below the true count.
	ErrorBound uint64
	Confidence float64
	// Span is how far back the window reaches from now.
	Span time.Duration
}

// Counter counts values over the last minute and the last hour. It is
// safe for concurrent use; Add allocates nothing.
type Counter struct {
	cfg  Config
	seed maphash.Seed
	mu   sync.Mutex
	fine ring // 10 s slots: the last minute
	// coarse is 10 min slots: the last hour. The fine slot now is in is
	// not folded in yet; older fine slots are.
	coarse ring
}

// New returns a Counter sized by cfg.
func New(cfg Config) (*Counter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Counter{cfg: cfg, seed: maphash.MakeSeed()}
	c.fine = newRing(cfg, fineSlot)
	c.coarse = newRing(cfg, coarseSlot)
	return c, nil
}

// Bytes returns the memory the Counter holds, which Config alone decides.
func (c *Counter) Bytes() int { return BytesFor(c.cfg) }

// BytesFor returns what a Counter of cfg holds, in bytes (0 for a Config
// New refuses).
func BytesFor(cfg Config) int {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0
	}
	perSlot := cfg.Width*cfg.Depth*4 + cfg.TopK*(8+4+1+cfg.ValueBytes) + 64
	return 2*slotsPerWin*perSlot + 256
}

// Add counts one occurrence of v at now.
func (c *Counter) Add(now time.Time, v string) {
	h := maphash.String(c.seed, v)
	c.mu.Lock()
	c.advance(now)
	s := &c.fine.slots[c.fine.pos]
	est := s.add(h, c.cfg.Width-1)
	offer(s, h, est, v, c.cfg.ValueBytes)
	c.mu.Unlock()
}

// advance moves the fine ring to now's slot, folding the slot it leaves
// into the coarse ring. A clock that goes back counts in the newest slot.
func (c *Counter) advance(now time.Time) {
	idx := now.UnixNano() / int64(fineSlot)
	if idx <= c.fine.cur {
		return
	}
	if old := &c.fine.slots[c.fine.pos]; old.epoch == c.fine.cur && old.total > 0 {
		cidx := c.fine.cur * int64(fineSlot) / int64(coarseSlot)
		c.coarse.moveTo(cidx)
		c.coarse.slots[c.coarse.pos].fold(old, c.cfg)
	}
	c.fine.moveTo(idx)
}

// Top returns the n values with the largest estimates in window (Minute
// or Hour) at now, largest first.
func (c *Counter) Top(now time.Time, window time.Duration, n int) (Top, error) {
	return TopOf(now, window, n, c)
}

// Sibling returns a new, empty Counter with c's Config and hash seed, so
// that TopOf can add their estimates: two Counters that between them
// count each occurrence once (admitted and denied, say) answer for the
// sum (requests) without a third.
func (c *Counter) Sibling() *Counter {
	s := &Counter{cfg: c.cfg, seed: c.seed}
	s.fine = newRing(c.cfg, fineSlot)
	s.coarse = newRing(c.cfg, coarseSlot)
	return s
}

// TopOf returns the n values with the largest sums of their estimates in
// the siblings cs (see Sibling) in window at now, largest first. The
// candidates are those of every Counter. A sum is never below the true
// count; the bound is e/Width of the summed totals, and holds with
// probability at least 1 - len(cs) x e^-Depth.
func TopOf(now time.Time, window time.Duration, n int, cs ...*Counter) (Top, error) {
	if window != Minute && window != Hour {
		return Top{}, ErrWindow
	}
	if len(cs) == 0 {
		return Top{}, nil
	}
	cfg := cs[0].cfg
	for _, c := range cs {
		if c.seed != cs[0].seed {
			return Top{}, errors.New("sketch: TopOf of counters that are not siblings")
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.advance(now)
	}
	idx := now.UnixNano() / int64(fineSlot)
	cidx := now.UnixNano() / int64(coarseSlot)
	var slots []*slot
	for _, c := range cs {
		for i := range c.fine.slots {
			s := &c.fine.slots[i]
			if s.epoch > idx-slotsPerWin && s.epoch <= idx && (window == Minute || s.epoch == idx) {
				slots = append(slots, s)
			}
		}
		if window == Hour {
			for i := range c.coarse.slots {
				s := &c.coarse.slots[i]
				if s.epoch > cidx-slotsPerWin && s.epoch <= cidx {
					slots = append(slots, s)
				}
			}
		}
	}
	t := Top{Span: slotsPerWin * fineSlot}
	if window == Hour {
		t.Span = slotsPerWin * coarseSlot
	}
	t.Confidence = max(0, 1-float64(len(cs))*math.Exp(-float64(cfg.Depth)))
	seen := map[uint64]bool{}
	for _, s := range slots {
		t.Total += s.total
		for i := 0; i < s.used; i++ {
			h := s.hashes[i]
			if seen[h] {
				continue
			}
			seen[h] = true
			var est uint64
			for _, o := range slots {
				est += uint64(o.estimate(h, cfg.Width-1))
			}
			v := s.vals[i*cfg.ValueBytes : i*cfg.ValueBytes+int(s.lens[i])]
			t.Hits = append(t.Hits, Hit{Value: string(v), Count: est, Truncated: s.cut[i]})
		}
	}
	slices.SortFunc(t.Hits, func(a, b Hit) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Value, b.Value)
	})
	if len(t.Hits) > n {
		t.Hits = t.Hits[:max(n, 0)]
	}
	t.ErrorBound = uint64(math.Ceil(math.E / float64(cfg.Width) * float64(t.Total)))
	return t, nil
}

// ring is a circle of slots, each for one interval of length dur; cur is
// the index (Unix time / dur) of the newest slot, at pos.
type ring struct {
	slots []slot
	dur   time.Duration
	cur   int64
	pos   int
}

func newRing(cfg Config, dur time.Duration) ring {
	r := ring{slots: make([]slot, slotsPerWin), dur: dur, cur: math.MinInt64}
	for i := range r.slots {
		r.slots[i] = newSlot(cfg)
		r.slots[i].epoch = math.MinInt64
	}
	return r
}

// moveTo makes the slot of index idx the newest, emptied if it held an
// older interval. An idx before the newest slot's keeps the newest.
func (r *ring) moveTo(idx int64) {
	if idx <= r.cur {
		return
	}
	r.cur = idx
	r.pos = int(uint64(idx) % uint64(len(r.slots)))
	if s := &r.slots[r.pos]; s.epoch != idx {
		s.reset(idx)
	}
}

// slot is one interval's count-min sketch and its candidates.
type slot struct {
	epoch  int64
	total  uint64
	rows   [][]uint32 // Depth rows of Width counters
	used   int
	hashes []uint64 // of the candidates
	counts []uint32 // their estimates when last seen
	low    uint32   // the least of counts once all TopK are used
	lens   []uint8
	cut    []bool
	vals   []byte // TopK x ValueBytes
}

func newSlot(cfg Config) slot {
	s := slot{
		rows:   make([][]uint32, cfg.Depth),
		hashes: make([]uint64, cfg.TopK),
		counts: make([]uint32, cfg.TopK),
		lens:   make([]uint8, cfg.TopK),
		cut:    make([]bool, cfg.TopK),
		vals:   make([]byte, cfg.TopK*cfg.ValueBytes),
	}
	cells := make([]uint32, cfg.Width*cfg.Depth)
	for i := range s.rows {
		s.rows[i] = cells[i*cfg.Width : (i+1)*cfg.Width]
	}
	return s
}

func (s *slot) reset(epoch int64) {
	s.epoch, s.total, s.used, s.low = epoch, 0, 0, 0
	for _, r := range s.rows {
		clear(r)
	}
}

// index returns the column of h in row i: h mixed with the row number by
// splitmix64's finalizer, so that the rows are independent (two values
// that share a column in one row rarely share it in another).
func index(h uint64, i int, mask int) int {
	z := h + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return int((z ^ (z >> 31)) & uint64(mask))
}

// add counts h once with conservative update (only the counters at the
// minimum grow) and returns h's estimate after.
func (s *slot) add(h uint64, mask int) uint32 {
	s.total++
	var cells [MaxDepth]*uint32 // h's counter in each row, hashed once
	est := uint32(math.MaxUint32)
	for i, r := range s.rows {
		cells[i] = &r[index(h, i, mask)]
		est = min(est, *cells[i])
	}
	if est == math.MaxUint32 {
		return est // saturated
	}
	est++
	for _, c := range cells[:len(s.rows)] {
		if *c < est {
			*c = est
		}
	}
	return est
}

func (s *slot) estimate(h uint64, mask int) uint32 {
	est := uint32(math.MaxUint32)
	for i, r := range s.rows {
		est = min(est, r[index(h, i, mask)])
	}
	return est
}

// offer keeps h (value v) among the candidates if its estimate est is
// among the TopK largest seen in the slot. With the table full and est at
// most the least count kept, nothing changes: a candidate's estimate only
// grows, so h, if kept, has that least count already.
func offer[V string | []byte](s *slot, h uint64, est uint32, v V, vb int) {
	full := s.used == len(s.hashes)
	if full && est <= s.low {
		return
	}
	at := -1
	for i := 0; i < s.used; i++ {
		if s.hashes[i] == h {
			at = i
			break
		}
	}
	if at < 0 {
		if !full {
			at = s.used
			s.used++
		} else {
			at = slices.Index(s.counts[:s.used], s.low)
		}
		s.hashes[at] = h
		n := copy(s.vals[at*vb:(at+1)*vb], v)
		s.lens[at], s.cut[at] = uint8(min(n, 255)), n < len(v)
	}
	s.counts[at] = est
	if s.used == len(s.hashes) {
		s.low = slices.Min(s.counts[:s.used])
	}
}

// fold adds the counters and candidates of a fine slot into s.
func (s *slot) fold(f *slot, cfg Config) {
	s.total += f.total
	for i, r := range s.rows {
		for j, v := range f.rows[i] {
			r[j] = satAdd(r[j], v)
		}
	}
	for i := 0; i < f.used; i++ {
		h := f.hashes[i]
		v := f.vals[i*cfg.ValueBytes : i*cfg.ValueBytes+int(f.lens[i])]
		offer(s, h, s.estimate(h, cfg.Width-1), v, cfg.ValueBytes)
		if j := slices.Index(s.hashes[:s.used], h); j >= 0 {
			s.cut[j] = f.cut[i]
		}
	}
}

func satAdd(a, b uint32) uint32 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint32
}
