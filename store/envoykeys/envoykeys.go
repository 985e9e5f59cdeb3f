// Package envoykeys counts fixed windows in Redis under the keys, and with
// the commands, of Envoy's ratelimit service, so that during a rolling
// migration Envoy's ratelimit and sluice servers on one Redis share one set
// of counters.
//
// Store is a decorator of another sluice.Store. Requests that carry the
// descriptor Envoy's ratelimit counts them under (sluice.Request.Envoy;
// package decide sets it on the limits whose counter Envoy's could share)
// are counted as Envoy's ratelimit counts a limit: the counter's key is
// Config.Prefix (Envoy's CACHE_KEY_PREFIX), the domain, "_", then each
// entry's key, "_", value and "_", and the start of the window in seconds
// since the Unix epoch (the time truncated to a multiple of the period,
// read from the host's clock, as Envoy's does):
//
//	api_user_alice_path_/login_1763856000
//
// It gets INCRBY cost and EXPIRE period-in-seconds in one pipeline, and the
// request passes when the count after it is within the limit. Every other
// request goes to the decorated store.
//
// These requests are counted Envoy's way, not sluice's: the hits of a
// denied request are counted too (Envoy's ratelimit adds them before it
// compares), and the hits stay counted whatever the request's other limits
// decide; with Config.StopIncrementWhenOverLimit, as with Envoy's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, only the keys a request would
// take over their limits count its hits when there are such keys. Requests to the decorated store keep sluice's rule: when a
// request counted here is denied, the decorated store only checks them
// (cost 0), so the request consumes none of their quota.
package envoykeys

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

// ErrNotConnected is returned while the Redis client is not there yet: the
// caller's fail mode decides.
var ErrNotConnected = errors.New("envoy keys: redis not connected yet")

// Config configures a Store. The zero value is the default.
type Config struct {
	// Prefix begins every counter's key, as Envoy's CACHE_KEY_PREFIX
	// does. Default empty, as Envoy's.
	Prefix string
	// Now is the clock whose seconds name the windows, as Envoy's
	// ratelimit reads its host's clock (not Redis's). Default time.Now.
	Now func() time.Time
	// ExpiryJitter is the most added to a key's EXPIRE, a random number
	// of whole seconds below it, as Envoy's EXPIRATION_JITTER_MAX_SECONDS
	// adds, so that the keys of one window do not leave Redis at once.
	// Zero (the default): none.
	ExpiryJitter time.Duration
	// StopIncrementWhenOverLimit is Envoy's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: in a request with several
	// Envoy keys, the counts are read first (GET, as Envoy's reads them,
	// not atomically with the increments), and when one key's hits would
	// take it over its limit, only those keys count the hits; the others
	// get INCRBY 0. False (the default, Envoy's): every key counts.
	StopIncrementWhenOverLimit bool
}

// DefaultConfig returns the default configuration: what the zero Config
// means.
func DefaultConfig() Config {
	return Config{
		Now: time.Now, // the host's clock, as Envoy's ratelimit reads it
		// Prefix: "", Envoy's; ExpiryJitter: 0, none;
		// StopIncrementWhenOverLimit: off, as Envoy's
	}
}

// Store counts the requests that carry an Envoy descriptor in Redis as
// Envoy's ratelimit does, and passes the others to the store it decorates.
// It is safe for concurrent use.
type Store struct {
	next   sluice.Store
	prefix string // Config.Prefix
	client func() rueidis.Client
	now    func() time.Time
	jitter int64 // Config.ExpiryJitter in whole seconds
	stop   bool  // Config.StopIncrementWhenOverLimit
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store over next whose Envoy keys are counted with the
// client that client returns: store/redis's Store.Client, which is nil
// until Redis first answers (then requests with Envoy keys fail with
// ErrNotConnected). The client is the caller's to close.
func New(next sluice.Store, client func() rueidis.Client, cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = DefaultConfig().Now
	}
	return &Store{next: next, prefix: cfg.Prefix, client: client, now: cfg.Now, jitter: int64(cfg.ExpiryJitter / time.Second),
		stop: cfg.StopIncrementWhenOverLimit}
}

// envoy reports whether r is counted as Envoy's ratelimit counts it.
func envoy(r *sluice.Request) bool { return r.Envoy.Domain != "" }

// TakeAll counts the requests with Envoy descriptors in one pipeline of INCRBY
// and EXPIRE per request, then passes the others to the decorated store in
// one TakeAll: with their costs when every request counted here passed,
// and otherwise with cost 0, reporting each as it would have decided with
// its hits taken (a request that would have been denied reports the time
// until its limit is whole again as its retry time, which is never early).
// An Envoy key's limit must be a fixed_window of whole seconds; another is
// an error wrapping sluice.ErrLimit.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	n := 0
	for i := range reqs {
		if envoy(&reqs[i]) {
			n++
		}
	}
	if n == 0 {
		return s.next.TakeAll(ctx, reqs, ds)
	}
	denied, err := s.count(ctx, reqs, ds, n)
	if err != nil || n == len(reqs) {
		return err
	}
	others := make([]sluice.Request, 0, len(reqs)-n)
	idx := make([]int, 0, len(reqs)-n)
	for i := range reqs {
		if !envoy(&reqs[i]) {
			r := reqs[i]
			if denied {
				r.Cost = 0
			}
			others = append(others, r)
			idx = append(idx, i)
		}
	}
	od := make([]sluice.Decision, len(others))
	if err := s.next.TakeAll(ctx, others, od); err != nil {
		return err
	}
	for k, i := range idx {
		d := od[k]
		if cost := reqs[i].Cost; denied && cost > 0 {
			d = asTaken(d, cost)
		}
		ds[i] = d
	}
	return nil
}

// asTaken restates d, a decision taken with cost 0, as the decision a
// request of cost would have had with its hits taken.
func asTaken(d sluice.Decision, cost int64) sluice.Decision {
	if cost <= d.Remaining {
		d.Remaining -= cost
		return d
	}
	d.Allowed = false
	d.RetryAfter = d.ResetAfter
	if cost > d.Limit {
		d.RetryAfter = sluice.Never
	}
	return d
}

// count counts the n requests of reqs with Envoy keys and writes their
// decisions, reporting whether one of them was denied.
func (s *Store) count(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision, n int) (bool, error) {
	c := s.client()
	if c == nil {
		return false, ErrNotConnected
	}
	now := s.now()
	sec := now.Unix()
	names := make([]string, 0, n)
	for i := range reqs {
		r := &reqs[i]
		if !envoy(r) {
			continue
		}
		p, err := periodSeconds(r.Limit)
		if err != nil {
			return false, err
		}
		names = append(names, s.key(&r.Envoy, sec/p*p))
	}
	over, err := s.over(ctx, c, reqs, names)
	if err != nil {
		return false, err
	}
	cmds := make(rueidis.Commands, 0, 2*n)
	j := 0
	for i := range reqs {
		r := &reqs[i]
		if !envoy(r) {
			continue
		}
		p, _ := periodSeconds(r.Limit)
		ttl := p
		if s.jitter > 0 {
			ttl += rand.Int64N(s.jitter)
		}
		hits := r.Cost
		if over != nil && !over[j] {
			hits = 0 // another key is over: this one does not count (Envoy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)
		}
		cmds = append(cmds, c.B().Incrby().Key(names[j]).Increment(hits).Build(), c.B().Expire().Key(names[j]).Seconds(ttl).Build())
		j++
	}
	res := c.DoMulti(ctx, cmds...)
	denied := false
	j = 0
	for i := range reqs {
		r := &reqs[i]
		if !envoy(r) {
			continue
		}
		after, err := res[j].AsInt64()
		if err == nil {
			err = res[j+1].Error()
		}
		if err != nil {
			return false, fmt.Errorf("envoy key of %s: %w", r.Key, err)
		}
		j += 2
		p, _ := periodSeconds(r.Limit)
		end := time.Unix((sec/p+1)*p, 0)
		ds[i] = decision(r.Limit.Capacity(), r.Cost, after, end.Sub(now))
		denied = denied || !ds[i].Allowed
	}
	return denied, nil
}

// Counts reports whether r is counted here, under an Envoy key: whether
// it carries an Envoy descriptor.
func (s *Store) Counts(r *sluice.Request) bool { return envoy(r) }

// WriteBack counts in Redis hits admitted without it (decide's fail mode
// local) as Envoy's ratelimit counts them, so that Envoy's servers on the
// same Redis see them: INCRBY reqs[i].Cost on the key of reqs[i].Envoy in
// the window that starts at windows[i] (µs since the Unix epoch on the
// host's clock, as Envoy's names its windows), whether or not they fit,
// and EXPIRE, in one pipeline. Every request must be one Counts reports;
// a limit this layer does not count is an error wrapping sluice.ErrLimit.
func (s *Store) WriteBack(ctx context.Context, reqs []sluice.Request, windows []int64) error {
	c := s.client()
	if c == nil {
		return ErrNotConnected
	}
	cmds := make(rueidis.Commands, 0, 2*len(reqs))
	for i := range reqs {
		r := &reqs[i]
		name, p, err := s.windowKey(r, windows[i], "write back")
		if err != nil {
			return err
		}
		ttl := p
		if s.jitter > 0 {
			ttl += rand.Int64N(s.jitter)
		}
		cmds = append(cmds, c.B().Incrby().Key(name).Increment(r.Cost).Build(), c.B().Expire().Key(name).Seconds(ttl).Build())
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("envoy key of %s: write back: %w", reqs[i/2].Key, err)
		}
	}
	return nil
}

// windowKey returns the Envoy key of r's count in the window that starts
// at window (µs since the Unix epoch), and the limit's period in seconds;
// op names the caller in its errors.
func (s *Store) windowKey(r *sluice.Request, window int64, op string) (string, int64, error) {
	p, err := periodSeconds(r.Limit)
	if err != nil {
		return "", 0, err
	}
	if !envoy(r) {
		return "", 0, fmt.Errorf("envoy keys: %s %s: no Envoy descriptor", op, r.Key)
	}
	start := window / int64(time.Second/time.Microsecond)
	return s.key(&r.Envoy, start/p*p), p, nil
}

// restoreScript raises the count of KEYS[1] to ARGV[1] if it is lower,
// then keeps it ARGV[2] seconds; a count at or above it stays as it is.
const restoreScript = `local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
return c`

// RestoreCounts puts back, under their Envoy keys, counts Redis lost (a
// restart without persistence, a failover to a replica that lagged), as
// a server knew them: reqs[i].Cost is what the key of reqs[i].Envoy
// counted at least in the window that starts at windows[i] (µs since the
// Unix epoch, on the host's clock). A count below it is raised to it and
// kept for the limit's period; one at or above it is left alone, so
// servers that each put back what they knew never add up (a merge by
// maximum, one script call a key, pipelined). Every request must be one
// Counts reports; a limit this layer does not count is an error wrapping
// sluice.ErrLimit.
func (s *Store) RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) error {
	c := s.client()
	if c == nil {
		return ErrNotConnected
	}
	cmds := make(rueidis.Commands, 0, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		name, p, err := s.windowKey(r, windows[i], "restore")
		if err != nil {
			return err
		}
		cmds = append(cmds, c.B().Eval().Script(restoreScript).Numkeys(1).Key(name).
			Arg(strconv.FormatInt(r.Cost, 10), strconv.FormatInt(p, 10)).Build())
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return fmt.Errorf("envoy key of %s: restore: %w", reqs[i].Key, err)
		}
	}
	return nil
}

// over reads, with StopIncrementWhenOverLimit and several Envoy keys in
// reqs (their names in order), which keys the requests' hits would take
// over their limits, as Envoy's ratelimit reads them before it counts. It
// returns nil when every key counts: without the option, with one key, or
// with none over.
func (s *Store) over(ctx context.Context, c rueidis.Client, reqs []sluice.Request, names []string) ([]bool, error) {
	if !s.stop || len(names) < 2 {
		return nil, nil
	}
	gets := make(rueidis.Commands, len(names))
	for j, name := range names {
		gets[j] = c.B().Get().Key(name).Build()
	}
	res := c.DoMulti(ctx, gets...)
	over := make([]bool, len(names))
	any := false
	j := 0
	for i := range reqs {
		r := &reqs[i]
		if !envoy(r) {
			continue
		}
		n, err := res[j].AsInt64()
		if rueidis.IsRedisNil(err) {
			n, err = 0, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envoy key of %s: %w", r.Key, err)
		}
		over[j] = n+r.Cost > r.Limit.Capacity()
		any = any || over[j]
		j++
	}
	if !any {
		return nil, nil
	}
	return over, nil
}

// key returns the Redis key of the counter of descriptor d in the window
// that starts at start, in seconds: see the package documentation.
func (s *Store) key(d *sluice.Descriptor, start int64) string {
	n := len(s.prefix) + len(d.Domain) + 1 + 20 // 20: the digits of an int64
	for _, e := range d.Entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(s.prefix)
	b.WriteString(d.Domain)
	b.WriteByte('_')
	for _, e := range d.Entries {
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
		b.WriteByte('_')
	}
	var digits [20]byte
	b.Write(strconv.AppendInt(digits[:0], start, 10))
	return b.String()
}

// periodSeconds returns the period of l in whole seconds, or an error
// wrapping sluice.ErrLimit when l is not a fixed window of whole seconds.
func periodSeconds(l sluice.Limit) (int64, error) {
	if l.Algorithm != sluice.FixedWindow || l.Period < time.Second || l.Period%time.Second != 0 {
		return 0, fmt.Errorf("%w: envoy keys count fixed windows of whole seconds, not %s", sluice.ErrLimit, l)
	}
	return int64(l.Period / time.Second), nil
}

// decision is the decision on a request of cost hits against a limit of
// capacity hits a window, given the count after Envoy's INCRBY and the
// time left in the window: allowed when the count is within the limit, as
// Envoy's ratelimit decides.
func decision(capacity, cost, after int64, left time.Duration) sluice.Decision {
	d := sluice.Decision{Allowed: after <= capacity, Limit: capacity, Remaining: max(capacity-after, 0)}
	if after > 0 {
		d.ResetAfter = left
	}
	switch {
	case d.Allowed:
	case cost > capacity:
		d.RetryAfter = sluice.Never
	default:
		d.RetryAfter = left
	}
	return d
}
