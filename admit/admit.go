// Package admit is sluice's concurrency limits (a rule's Concurrency): a
// step of admission after decide's rate decision. For each descriptor the
// rate limits allowed whose rule has a Concurrency, it takes a slot of a
// slots.Counter (slots.Memory on one node, store/redis's SlotCounter
// across nodes); when one is refused it gives back those taken and the
// request is over the limit. The request holds its slots until
// decide.Response.Done, or until their lease ends.
//
// A Step is a decide.Admitter: the server hands it to decide's
// Config.Admit, so that every way in (gRPC, the JSON API, forward-auth,
// the proxy, the middleware) takes slots after the rate limits, and the
// shadow mode, the fail-mode accounting and the observers see its verdict.
package admit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/slots"
)

// Config configures a Step. A zero field means its default, as stated at
// each field and in DefaultConfig.
type Config struct {
	// Slots keeps the requests in flight. Default: a slots.Memory of
	// slots.DefaultConfig on Now's clock, which is exact on one node; give
	// store/redis's SlotCounter to count across nodes.
	Slots slots.Counter
	// Fail says how to admit while Slots fails, as decide's Config.Fail:
	// FailOpen admits without a slot, FailClosed denies, FailLocal counts
	// on the node's own slots.Memory. Give decide's. Default FailLocal,
	// as decide's.
	Fail decide.Fail
	// Timeout bounds each call of a Slots given (the default slots.Memory
	// is called without one); give decide's StoreTimeout. Default 50ms.
	// Negative means no timeout beyond the caller's context.
	Timeout time.Duration
	// Lease is how long a decision API request (Request.Hold false) holds
	// a slot: those callers never say when the request ends. Default 1s.
	Lease time.Duration
	// HoldLease is the longest a request that calls Response.Done holds a
	// slot (a response streaming longer stops counting then): it frees the
	// slots of a node that died holding them. Default 10m.
	HoldLease time.Duration
	// DigestAbove is the length in bytes above which a descriptor's value
	// is kept in slot keys as its digest (rules.AppendDigested). Default
	// rules.DefaultDigestAbove, as decide's.
	DigestAbove int
	// Logger receives the failures of Slots (Debug). Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the default slots.Memory's clock. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns a Config with every default filled in and no
// Slots: what every zero field of a Config means.
func DefaultConfig() Config {
	return Config{
		Fail:        decide.FailLocal,         // as decide's
		Timeout:     50 * time.Millisecond,    // as decide's StoreTimeout: a Redis round trip is ~0.1-1ms
		Lease:       time.Second,              // decision APIs: a slot per request for a second
		HoldLease:   10 * time.Minute,         // proxy, middleware: freed at the response's end, or then
		DigestAbove: rules.DefaultDigestAbove, // the slot keys name values as the store keys do
		Logger:      slog.Default(),
		Now:         time.Now,
	}
}

// withDefaults returns c with each zero field set to its default, or an
// error for a field no default can fix.
func (c Config) withDefaults() (Config, error) {
	def := DefaultConfig()
	switch {
	case c.Fail > decide.FailClosed:
		return c, fmt.Errorf("admit: unknown fail mode %d", c.Fail)
	case c.Lease < 0 || c.HoldLease < 0:
		return c, fmt.Errorf("admit: Lease %v and HoldLease %v must not be negative", c.Lease, c.HoldLease)
	case c.DigestAbove < 0:
		return c, errors.New("admit: DigestAbove must not be negative")
	}
	if c.Timeout == 0 {
		c.Timeout = def.Timeout
	}
	if c.Lease == 0 {
		c.Lease = def.Lease
	}
	if c.HoldLease == 0 {
		c.HoldLease = def.HoldLease
	}
	if c.DigestAbove == 0 {
		c.DigestAbove = def.DigestAbove
	}
	if c.Logger == nil {
		c.Logger = def.Logger
	}
	if c.Now == nil {
		c.Now = def.Now
	}
	return c, nil
}

// Step takes and gives back the concurrency slots of decided requests. It
// is safe for concurrent use.
type Step struct {
	slots     slots.Counter
	local     slots.Counter // FailLocal's slots, or nil
	fail      decide.Fail
	timeout   time.Duration // for each call of slots; 0 for none
	lease     time.Duration
	holdLease time.Duration
	digest    int
	log       *slog.Logger
	bufs      sync.Pool // *buffer
	holdings  sync.Pool // *holding, given back by Release
}

var _ decide.Admitter = (*Step)(nil)

// New returns a Step for cfg.
func New(cfg Config) (*Step, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Step{slots: cfg.Slots, fail: cfg.Fail, lease: cfg.Lease, holdLease: cfg.HoldLease, digest: cfg.DigestAbove, log: cfg.Logger}
	s.bufs.New = func() any { return new(buffer) }
	s.holdings.New = func() any {
		h := &holding{s: s}
		h.slots = h.one[:0]
		return h
	}
	if s.slots == nil {
		if s.slots, err = slots.NewMemory(slots.Config{Now: cfg.Now}); err != nil {
			return nil, fmt.Errorf("admit: %w", err)
		}
		return s, nil
	}
	s.timeout = max(cfg.Timeout, 0)
	if cfg.Fail == decide.FailLocal {
		if s.local, err = slots.NewMemory(slots.Config{Now: cfg.Now}); err != nil {
			return nil, fmt.Errorf("admit: %w", err)
		}
	}
	return s, nil
}

// buffer holds the slot key of one descriptor while it is written;
// buffers are pooled.
type buffer struct {
	key     []byte
	entries []decide.Entry
}

// noID is a limit without an ID: rules.Rule.AppendKey then writes only a
// descriptor's values, which follow the rule's ConcurrencyID in slot keys.
var noID rules.Limit

// slotKey returns the slot key of a descriptor of entries that matched
// rule: its ConcurrencyID, then its values as in store keys (long ones
// digested).
func (s *Step) slotKey(b *buffer, rule *rules.Rule, entries []decide.Entry) string {
	b.entries = rules.AppendDigested(b.entries[:0], entries, s.digest)
	b.key = append(b.key[:0], rule.ConcurrencyID...)
	b.key = rule.AppendKey(b.key, &noID, b.entries)
	clear(b.entries) // keeps no request's values
	return string(b.key)
}

// Admit implements decide.Admitter: it takes the concurrency slots of
// resp's descriptors whose rule has a Concurrency, one by one; when one is
// refused it gives back those taken, and the request is over the limit
// (the hits its rate limits took stay taken, as for a request denied by
// another descriptor). A failing Slots is decided by the fail mode: open
// admits without a slot, closed denies, local counts on the node's own
// slots.Memory; resp.Mode is then the fail mode's. A request that will
// call Done (r.Hold) holds its slots for HoldLease, another for Lease.
func (s *Step) Admit(ctx context.Context, r *decide.Request, resp *decide.Response) {
	lease := s.lease
	if r.Hold {
		lease = s.holdLease
	}
	var h *holding
	var b *buffer
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		rule := st.Rule
		if rule == nil || rule.Concurrency == 0 || r.Descriptors[i].Cost == 0 {
			continue
		}
		if b == nil {
			b = s.bufs.Get().(*buffer)
		}
		key := s.slotKey(b, rule, r.Descriptors[i].Entries)
		counter, g, err := s.acquire(ctx, key, rule.Concurrency, lease)
		switch {
		case err != nil && s.fail != decide.FailClosed:
			s.log.Debug("slots failed", "err", err, "fail", s.fail)
			resp.Mode = s.fail.Mode()
			continue // open: admitted without a slot
		case err != nil:
			s.log.Debug("slots failed", "err", err, "fail", s.fail)
			resp.Mode = s.fail.Mode()
			g = slots.Grant{}
		}
		if g.OK {
			if h == nil {
				h = s.holdings.Get().(*holding)
			}
			h.slots = append(h.slots, slot{counter: counter, key: key, token: g.Token})
			continue
		}
		deny(r, resp, st, g)
	}
	if b != nil {
		s.bufs.Put(b)
	}
	switch {
	case h == nil:
	case resp.Overall == decide.OverLimit:
		h.Release(ctx)
	default:
		resp.Hold(h)
	}
}

// acquire takes a slot of key from s.slots, within s.timeout, or from
// s.local (FailLocal) when they fail; it returns where it took it.
func (s *Step) acquire(ctx context.Context, key string, limit int64, lease time.Duration) (slots.Counter, slots.Grant, error) {
	tctx, cancel := ctx, context.CancelFunc(nil)
	if s.timeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, s.timeout)
	}
	counter := s.slots
	g, err := counter.Acquire(tctx, key, limit, lease)
	if cancel != nil {
		cancel()
	}
	if err != nil && s.local != nil {
		counter = s.local
		g, err = counter.Acquire(ctx, key, limit, lease)
	}
	return counter, g, err
}

// deny writes the refusal of st's slot (g, not OK) into resp: over the
// limit, or in shadow mode OK and ShadowOverLimit.
func deny(r *decide.Request, resp *decide.Response, st *decide.Status, g slots.Grant) {
	// A slot may free at any moment: ask for a second, or, where the
	// leases are the decision APIs' (r.Hold false), until the first
	// ends. A held slot frees when its response ends, not at its
	// lease's end (HoldLease, minutes), so a held request asks for 1s.
	retry := max(g.RetryAfter, time.Second)
	if r.Hold {
		retry = time.Second
	}
	if st.Shadow {
		st.ShadowOverLimit = true
		return
	}
	st.Code, st.Limit, st.Concurrency = decide.OverLimit, nil, true
	st.Decision.Allowed, st.Decision.Limit, st.Decision.Remaining = false, st.Rule.Concurrency, 0
	st.Decision.RetryAfter, st.Decision.ResetAfter = retry, retry
	resp.Overall = decide.OverLimit
}

// slot is a slot a request holds.
type slot struct {
	counter slots.Counter // where it is held
	key     string
	token   uint64
}

// holding is the slots a request holds until Response.Done: a
// decide.Holding. Holdings are pooled: Release gives one back, so that a
// request that calls Done allocates only its slots' keys.
type holding struct {
	s     *Step
	slots []slot
	one   [1]slot // slots' array for a request with one
}

// Release implements decide.Holding: it gives back every slot, within the
// Step's timeout, then h to the Step's pool; h is not used after.
func (h *holding) Release(ctx context.Context) {
	if h.s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.s.timeout)
		defer cancel()
	}
	for i, sl := range h.slots {
		if err := sl.counter.Release(ctx, sl.key, sl.token); err != nil {
			h.s.log.Debug("slot release failed; it frees at the end of its lease", "err", err)
		}
		h.slots[i] = slot{}
	}
	h.slots = h.slots[:0]
	h.s.holdings.Put(h)
}
