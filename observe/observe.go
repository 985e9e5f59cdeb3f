// Package observe watches the decisions of sluice's decision service as
// its observers (decide.Observer), as metrics does: a Watcher counts the requests and the
// denials of every client in bounded memory (package sketch), per domain
// and descriptor key, for GET /v1/top, and it logs a sample of the
// denials. GET /v1/keys shows one client's state under its limits.
package observe

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/coarseclock"
	"github.com/sluicehq/sluice/sketch"
)

// Config configures a Watcher. A zero field means its default.
type Config struct {
	// Sketch sizes the counters of each domain and descriptor key (two
	// per key: requests and denials).
	Sketch sketch.Config
	// MaxKeys is the most domain and descriptor key pairs counted; the
	// rules bound them too, since only the keys of descriptors that
	// matched a rule are counted. Default 16: with the default sketch,
	// 2 x 16 x sketch.BytesFor = 6.5 MiB at most.
	MaxKeys int
	// DenialLogRate is the most denials logged per second (a token bucket
	// with a burst of as many); the lines beyond are counted and the next
	// line logged says how many. Default 10; negative logs none.
	DenialLogRate float64
	// Logger receives the denial lines, at level Info. Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock of the windows. Nil (the default) means the
	// Watcher's own clock, which reads the system clock every 100 ms from
	// a goroutine that Close stops. Tests pass a fake clock here.
	Now func() time.Time
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Sketch:        sketch.DefaultConfig(),
		MaxKeys:       16, // keys of a few domains' rules; 6.5 MiB at most
		DenialLogRate: 10, // lines a second: enough to see who, not a flood in the logs
		Logger:        slog.Default(),
		Now:           nil, // the Watcher's coarse clock
	}
}

// MaxMaxKeys caps Config.MaxKeys.
const MaxMaxKeys = 1024

// Watcher counts the decisions of a decide.Service, as one of its
// Observers, and logs its denials. It is safe for concurrent use. Close it
// when done.
type Watcher struct {
	cfg     Config
	clock   *coarseclock.Clock // nil when Config.Now is set
	logs    *rate.Limiter      // nil: no denial log
	dropped atomic.Int64       // denial lines not logged since the last one
	// quiet is when logs next has a token (Unix ns) after it last
	// refused: a denial before that is not logged, without taking the
	// limiter's lock, as the limiter would refuse it too.
	quiet atomic.Int64

	seed maphash.Seed // of counters.last's slots

	mu   sync.Mutex                                      // held to add keys
	keys atomic.Pointer[map[string]map[string]*counters] // domain -> key; copied on write
	nkey int
	full atomic.Bool // nkey reached MaxKeys
}

// counters are the counts of one domain and descriptor key: each request
// counts once, as admitted or as denied, and the requests are their sum
// (sketch.TopOf), so a decision updates one sketch.
type counters struct {
	admitted, denied *sketch.Counter
	// last remembers, by the value's hash, the descriptor a value of this
	// key was last denied with and its rule, for a descriptor of several
	// entries: what the key's value alone does not say (user=alice denied
	// under api.user.path_/login was denied with path=/login). A slot
	// holds one value; another value whose hash falls there takes its
	// place.
	last [lastSlots]atomic.Pointer[denial]
}

// lastSlots is how many values of one key counters.last remembers, and
// maxDenialBytes the most bytes of one remembered descriptor (its values,
// keys and rule); a longer one is not remembered. With MaxKeys 16:
// 16 x 256 x (512 + 64) bytes, 2.3 MiB at most.
const (
	lastSlots      = 256
	maxDenialBytes = 512
)

// denial is a descriptor denied: the value of the counted key, the rule
// that denied it and the descriptor's entries down to the rule's depth,
// packed in one string (each key and value as its length, ':' and its
// bytes) so that remembering one takes two allocations.
type denial struct {
	value, rule, entries string // value and rule are the start of entries' backing string
}

// remember records in c that value was denied with entries (more than one)
// under rule, allocating only when that is not what its slot holds
// already.
func (c *counters) remember(seed maphash.Seed, value, rule string, entries []decide.Entry) {
	slot := &c.last[maphash.String(seed, value)%lastSlots]
	if d := slot.Load(); d != nil && d.value == value && d.rule == rule && packedEqual(d.entries, entries) {
		return
	}
	n := len(value) + len(rule)
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2*(1+len(strconv.Itoa(max(len(e.Key), len(e.Value)))))
	}
	if n > maxDenialBytes {
		return
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(value)
	b.WriteString(rule)
	for _, e := range entries {
		for _, s := range []string{e.Key, e.Value} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	all := b.String()
	v, r := len(value), len(value)+len(rule)
	slot.Store(&denial{value: all[:v], rule: all[v:r], entries: all[r:]})
}

// packedEqual reports whether packed (denial.entries) holds entries.
func packedEqual(packed string, entries []decide.Entry) bool {
	for _, e := range entries {
		for _, s := range []string{e.Key, e.Value} {
			l := strconv.Itoa(len(s))
			if !strings.HasPrefix(packed, l) || len(packed) < len(l)+1+len(s) || packed[len(l)] != ':' || packed[len(l)+1:len(l)+1+len(s)] != s {
				return false
			}
			packed = packed[len(l)+1+len(s):]
		}
	}
	return packed == ""
}

// unpack returns the entries packed holds (denial.entries).
func unpack(packed string) []decide.Entry {
	var out []decide.Entry
	var kv [2]string
	for i := 0; packed != ""; i++ {
		l, rest, ok := strings.Cut(packed, ":")
		n, err := strconv.Atoi(l)
		if !ok || err != nil || n > len(rest) {
			return nil
		}
		kv[i%2], packed = rest[:n], rest[n:]
		if i%2 == 1 {
			out = append(out, decide.Entry{Key: kv[0], Value: kv[1]})
		}
	}
	return out
}

// recall returns what remember recorded of value, or nil.
func (c *counters) recall(seed maphash.Seed, value string) *denial {
	if d := c.last[maphash.String(seed, value)%lastSlots].Load(); d != nil && d.value == value {
		return d
	}
	return nil
}

// New returns a Watcher: give it to decide.Config.Observers.
func New(cfg Config) (*Watcher, error) {
	d := DefaultConfig()
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = d.MaxKeys
	}
	if cfg.MaxKeys < 0 || cfg.MaxKeys > MaxMaxKeys {
		return nil, fmt.Errorf("observe: max keys %d: want 1 to %d", cfg.MaxKeys, MaxMaxKeys)
	}
	if cfg.DenialLogRate == 0 {
		cfg.DenialLogRate = d.DenialLogRate
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Logger
	}
	if _, err := sketch.New(cfg.Sketch); err != nil {
		return nil, fmt.Errorf("observe: %w", err)
	}
	o := &Watcher{cfg: cfg, seed: maphash.MakeSeed()}
	if cfg.Now == nil {
		c := coarseclock.New(clockResolution)
		o.clock = c
		o.cfg.Now = func() time.Time { return time.UnixMicro(c.Now()) }
	}
	if cfg.DenialLogRate > 0 {
		o.logs = rate.NewLimiter(rate.Limit(cfg.DenialLogRate), max(1, int(cfg.DenialLogRate)))
	}
	m := map[string]map[string]*counters{}
	o.keys.Store(&m)
	return o, nil
}

// Close stops the Watcher's clock, if it has its own. It is safe to call
// more than once; the Watcher must not be used after.
func (o *Watcher) Close() error {
	if o.clock != nil {
		o.clock.Close()
	}
	return nil
}

// Observe implements decide.Observer: it counts the entries that name a
// client (those of levels without a fixed value, or all when every level
// has one) of each descriptor of r that matched a rule under its domain
// and key, as a request and, when the descriptor was over its limit (or
// would have been, in shadow mode), as a denial, remembering the
// descriptor and rule of the denial for GET /v1/top, and logs a sample of
// the denials. An
// invalid request (err) is not counted.
func (o *Watcher) Observe(_ context.Context, r *decide.Request, resp *decide.Response, err error) {
	if err != nil || resp == nil {
		return
	}
	o.count(r, resp)
}

var _ decide.Observer = (*Watcher)(nil)

// count counts the statuses of resp, the answer to r.
func (o *Watcher) count(r *decide.Request, resp *decide.Response) {
	var now time.Time
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Rule == nil || i >= len(r.Descriptors) {
			continue
		}
		if now.IsZero() {
			now = o.cfg.Now()
		}
		denied := st.Code == decide.OverLimit || st.ShadowOverLimit
		entries := r.Descriptors[i].Entries
		entries = entries[:min(len(entries), st.Rule.Depth())]
		// The entries that name a client: not those of a level that
		// matches one value (path=/login under user), the same for every
		// client of the rule; all when every level does (a rule of one
		// route alone).
		named := 0
		for j := range entries {
			if !st.Rule.Fixed(j) {
				named++
			}
		}
		for j, e := range entries {
			if named > 0 && st.Rule.Fixed(j) {
				continue
			}
			c := o.counters(st.Rule.Domain, e.Key)
			if c == nil {
				continue
			}
			if denied {
				c.denied.Add(now, e.Value)
				if len(entries) > 1 { // one entry says it all: key=value
					c.remember(o.seed, e.Value, st.Rule.Path, entries)
				}
			} else {
				c.admitted.Add(now, e.Value)
			}
		}
		if denied && o.logs != nil {
			o.logDenial(now, r.Domain, entries, st)
		}
	}
}

// logDenial logs one denial if the sample allows it.
func (o *Watcher) logDenial(now time.Time, domain string, entries []decide.Entry, st *decide.Status) {
	if now.UnixNano() < o.quiet.Load() {
		o.dropped.Add(1)
		return
	}
	if !o.logs.AllowN(now, 1) {
		o.dropped.Add(1)
		// At most one token's time: a denial logged by another goroutine
		// since AllowN refused cannot make it longer.
		wait := min(1-o.logs.TokensAt(now), 1) / float64(o.logs.Limit())
		o.quiet.Store(now.Add(time.Duration(wait * float64(time.Second))).UnixNano())
		return
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	attrs := []any{"domain", domain, "descriptor", b.String(), "rule", st.Rule.Path,
		"retry_after", st.Decision.RetryAfter, "shadow", st.Shadow}
	if st.Limit != nil {
		attrs = append(attrs, "limit", st.Limit.Enforced().String(), "limit_id", st.Limit.ID)
		if place := st.Limit.Place(); place != "" {
			attrs = append(attrs, "rules_file", place)
		}
	}
	if n := o.dropped.Swap(0); n > 0 {
		attrs = append(attrs, "unlogged_before", n)
	}
	o.cfg.Logger.Info("denied", attrs...)
}

// counters returns the counters of domain and key, made on first use, or
// nil when MaxKeys pairs are counted already.
func (o *Watcher) counters(domain, key string) *counters {
	if c := (*o.keys.Load())[domain][key]; c != nil || o.full.Load() {
		return c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.keys.Load()
	if c := old[domain][key]; c != nil {
		return c
	}
	if o.nkey >= o.cfg.MaxKeys {
		o.full.Store(true) // later calls need not lock
		return nil
	}
	adm, err := sketch.New(o.cfg.Sketch)
	if err != nil {
		return nil // New checked the Config
	}
	c := &counters{admitted: adm, denied: adm.Sibling()}
	m := make(map[string]map[string]*counters, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	inner := make(map[string]*counters, len(old[domain])+1)
	for k, v := range old[domain] {
		inner[k] = v
	}
	inner[strings.Clone(key)] = c
	m[strings.Clone(domain)] = inner
	o.keys.Store(&m)
	o.nkey++
	return c
}

// Key is a domain and descriptor key that a Watcher counts.
type Key struct {
	Domain string `json:"domain"`
	Key    string `json:"key"`
}

// Keys returns the domain and key pairs counted so far, sorted.
func (o *Watcher) Keys() []Key {
	var ks []Key
	for d, m := range *o.keys.Load() {
		for k := range m {
			ks = append(ks, Key{d, k})
		}
	}
	sortKeys(ks)
	return ks
}

// Bytes returns the memory the counters hold now; it grows with the keys
// counted, to at most 2 x MaxKeys x sketch.BytesFor(Config.Sketch).
func (o *Watcher) Bytes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return 2 * o.nkey * sketch.BytesFor(o.cfg.Sketch)
}

// lastDenial returns the descriptor and rule value of domain's key was
// last denied with, if remembered.
func (o *Watcher) lastDenial(domain, key, value string) *denial {
	c := (*o.keys.Load())[domain][key]
	if c == nil {
		return nil
	}
	return c.recall(o.seed, value)
}

// Top returns the heaviest n clients of domain and key, by requests (the
// sum of the admitted and denied sketches, whose candidates are those of
// either) or by denials (denied), in window (sketch.Minute or sketch.Hour). ok is false
// when the pair is not counted.
func (o *Watcher) Top(domain, key string, denied bool, window time.Duration, n int) (t sketch.Top, ok bool, err error) {
	c := (*o.keys.Load())[domain][key]
	if c == nil {
		return sketch.Top{}, false, nil
	}
	if denied {
		t, err = c.denied.Top(o.cfg.Now(), window, n)
	} else {
		t, err = sketch.TopOf(o.cfg.Now(), window, n, c.admitted, c.denied)
	}
	return t, true, err
}
