// Package decide is sluice's decision service, the one place that combines
// rules and a store: it matches each descriptor of a request to its limits,
// takes from the store for all of them at once, and answers per descriptor
// and overall, with Envoy's shadow mode, soft throttling, unlimited and
// share_threshold, and a fail mode with a circuit breaker for when the store
// is slow or down.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// ErrInvalidRequest is wrapped by every error of Decide: the request has no
// domain, no descriptors, a negative cost or a descriptor's own limit that
// rules.RequestRule refuses, or it is beyond one of Config's caps
// (MaxDescriptors, MaxEntries, MaxValueBytes), which the error names. A
// descriptor without entries, or with an entry whose key is empty, is
// valid, as in Envoy's ratelimit: no rule matches it.
// Transports answer it with InvalidArgument or 400 and the error's text.
var ErrInvalidRequest = errors.New("invalid request")

// NonBlocking is an optional interface of a sluice.Store whose calls never
// wait on I/O or for long on other callers, as store/memory's do not: the
// Service calls a store whose NonBlocking returns true without arming
// StoreTimeout's timer, which spares four allocations per decision.
// Decorators of a store pass it on.
type NonBlocking interface {
	NonBlocking() bool
}

// Ready is an optional interface of a sluice.Store that may not be able
// to decide yet, as a store still connecting (store/redis's Background):
// while Ready returns false, Mode reports the fail mode, before the
// breaker has seen a failure. Decorators of a store pass it on.
type Ready interface {
	Ready() bool
}

// Service decides requests against the rules in force and a store. It is
// safe for concurrent use. With the fail mode local over a store that
// blocks, each store call runs in a goroutine of its own, which ends
// within Config.StoreHardTimeout; Close waits for them. Otherwise it
// starts no goroutines.
type Service struct {
	rules        func() *rules.Set
	store        sluice.Store
	timeout      time.Duration // 0: no store timeout; the one in force is latency's
	latency      *latency
	fail         Fail
	ledger       *ledger                                                // what the fail mode local knows
	learns       bool                                                   // the ledger learns from the store's decisions
	writeBack    func(context.Context, []sluice.Request, []int64) error // Config.WriteBack
	restore      func(context.Context, []sluice.Request, []int64) error // Config.Restore
	hardTimeout  time.Duration                                          // Config.StoreHardTimeout
	late         sync.WaitGroup                                         // the store calls in flight of the fail mode local, the write-backs
	lateMu       sync.Mutex                                             // guards closed, and late's Add against Close's Wait
	closed       bool                                                   // Close has begun
	writing      atomic.Bool                                            // a write-back is in flight
	writeMu      sync.Mutex                                             // one writePending at a time
	settling     atomic.Int64                                           // µs since the Unix epoch of the Probe that found the store back; 0: none
	pingOK       atomic.Int64                                           // µs since the Unix epoch of Probe's last ping that succeeded
	seen         atomic.Int64                                           // µs on the clock when a decision or a Probe last ran (mark)
	resumed      atomic.Int64                                           // µs on the clock when the last pause ended; 0: none (see pause.go)
	maxLate      int                                                    // Config.MaxLateCalls
	holding      atomic.Int64                                           // local denials waiting for their keys (holdDenial)
	heldStore    atomic.Uint64                                          // local denials that waited and went to the store (HeldDenials)
	heldLocal    atomic.Uint64                                          // local denials that waited and stood
	lateN        int                                                    // the store calls in flight of the fail mode local, under lateMu
	inflight     *storeCall                                             // a list of them, under lateMu, for Close to cut short
	flights      *flights                                               // the hits of those calls, by key (flight.go)
	settleKeys   *keySettles                                            // keys local until the other servers wrote back (settle.go)
	calls        sync.Pool                                              // *storeCall that ended in time
	base         context.Context                                        // ends when Close cuts the store calls short
	stop         context.CancelFunc                                     // ends base
	coolDown     time.Duration
	log          *slog.Logger
	br           breaker
	batches      sync.Pool // *batch
	fallbackMode Mode
	fallbacks    fallbacks
	shadow       bool                        // Config.Shadow
	envoyKeys    bool                        // Config.EnvoyKeys
	observers    []Observer                  // Config.Observers
	starters     []Starter                   // those of them that are Starters
	ready        func() bool                 // the store's Ready, or nil
	ping         func(context.Context) error // Config.Ping
	caps         caps
	admit        Admitter    // Config.Admit, or nil
	unadmitted   atomic.Bool // a concurrency limit was decided without Admit, and the log said so
}

// caps are the limits on one request: Config's MaxDescriptors, MaxEntries,
// MaxValueBytes and DigestAbove.
type caps struct {
	descriptors, entries, value, digest int
}

// New returns a Service for cfg. Zero fields of cfg take the defaults of
// DefaultConfig; Store is required, and Local with FailLocal.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Service{
		rules:        cfg.Rules,
		store:        cfg.Store,
		timeout:      max(cfg.StoreTimeout, 0),
		latency:      newLatency(max(cfg.StoreTimeout, 0), cfg.StoreMaxTimeout),
		fail:         cfg.Fail,
		writeBack:    cfg.WriteBack,
		restore:      cfg.Restore,
		hardTimeout:  cfg.StoreHardTimeout,
		maxLate:      cfg.MaxLateCalls,
		coolDown:     cfg.BreakerCoolDown,
		log:          cfg.Logger,
		fallbackMode: cfg.Fail.Mode(),
		caps:         caps{descriptors: cfg.MaxDescriptors, entries: cfg.MaxEntries, value: cfg.MaxValueBytes, digest: cfg.DigestAbove},
		shadow:       cfg.Shadow,
		envoyKeys:    cfg.EnvoyKeys,
		ping:         cfg.Ping,
		admit:        cfg.Admit,
		br: breaker{
			failures: int64(max(cfg.BreakerFailures, 0)),
			window:   cfg.BreakerWindow.Microseconds(),
			coolDown: cfg.BreakerCoolDown,
			now:      cfg.Now,
			log:      cfg.Logger,
		},
	}
	s.observers = cfg.Observers
	for _, o := range cfg.Observers {
		if st, ok := o.(Starter); ok {
			s.starters = append(s.starters, st)
		}
	}
	nonBlocking := false
	if nb, ok := cfg.Store.(NonBlocking); ok && nb.NonBlocking() {
		s.timeout, nonBlocking = 0, true
	}
	servers := cfg.Servers
	if servers == nil {
		servers = func() int64 { return 1 }
	}
	s.ledger = newLedger(cfg.LedgerBytes, servers)
	s.ledger.sync = cfg.Sync
	s.seen.Store(cfg.Now().UnixMicro())
	s.learns = s.fail == FailLocal && !nonBlocking
	// Decisions go back to the store through Probe alone, once every
	// server has written back (settles).
	s.br.held = s.fail == FailLocal && s.writeBack != nil && s.ping != nil
	if s.fail == FailLocal && s.timeout > 0 { // the calls of fromStoreLate only
		s.flights = newFlights()
	}
	if s.fail == FailLocal && s.writeBack != nil {
		s.settleKeys = newKeySettles()
	}
	s.base, s.stop = context.WithCancel(context.Background())
	if r, ok := cfg.Store.(Ready); ok {
		s.ready = r.Ready
	}
	s.batches.New = func() any { return new(batch) }
	return s, nil
}

// Mode returns where decisions come from now: ModeStore; the fail mode's
// Mode while the circuit breaker keeps decisions away from the store or the
// store is not Ready; while the store's last calls timed out, ModeLocal
// with the fail mode local, else ModeSlow.
func (s *Service) Mode() Mode {
	switch {
	case s.br.open() || (s.ready != nil && !s.ready()):
		return s.fallbackMode
	case s.br.slowNow() && s.fail == FailLocal:
		return ModeLocal
	case s.br.slowNow():
		return ModeSlow
	}
	return ModeStore
}

// probeTimeout bounds Probe's ping when the Service has no store timeout.
const probeTimeout = time.Second

// Probe pings the store (Config.Ping) if decisions go without it now, the
// circuit breaker open or the store not Ready, and closes the breaker when
// the ping succeeds within the store timeout: so Mode, and the readiness a
// server reports from it, follows the store without waiting for traffic.
// With the fail mode local, Config.WriteBack and Config.Ping, only Probe
// closes the breaker (see settles): a store call that succeeds does not.
// Then, while the store decides, it writes back the hits the fail mode
// local admitted that the store did not count (Config.WriteBack). It
// returns the ping's or the write-back's error, and nil when there was
// nothing to do. A failed ping leaves the breaker as it is. The caller
// calls it every second or so, from a goroutine of its own: decisions go
// back to a store that answers again within that, and so do the hits.
func (s *Service) Probe(ctx context.Context) error {
	now := s.br.now().UnixMicro()
	s.mark(now)
	s.settleKeys.sweep(now)
	if !s.br.open() && (s.ready == nil || s.ready()) {
		// A store that refused or reset fewer calls than open the
		// breaker may have restarted empty as well (a restart quicker
		// than the breaker): what it forgot goes back before the hits
		// admitted without it, as after an open breaker.
		if s.restore != nil && s.br.takeErred() {
			s.ledger.suspect(s.br.now().UnixMicro())
		}
		return s.writePending(ctx)
	}
	if s.ping == nil {
		return nil
	}
	timeout := s.latency.now()
	if timeout <= 0 {
		timeout = probeTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := s.ping(pctx)
	cancel()
	now = s.br.now().UnixMicro() // after the ping
	if err != nil || (s.ready != nil && !s.ready()) {
		// A ping lost among those that succeed (a loaded machine, a
		// connection made again) does not start the settling again; a
		// store that answers no ping for settleFor does.
		if now-s.pingOK.Load() >= settleFor.Microseconds() {
			s.settling.Store(0)
		}
		return err
	}
	s.pingOK.Store(now)
	// The counts it may have forgotten (a restart without persistence)
	// and the hits admitted locally go first: the store counts them
	// before it decides anew.
	if s.restore != nil && s.settling.Load() == 0 {
		s.br.takeErred()
		s.ledger.suspect(s.br.now().UnixMicro())
	}
	err = s.writePending(ctx)
	if s.settles() {
		return err
	}
	s.br.close()
	s.settleKeys.clear() // the servers have written back
	return err
}

// settleFor is how long, with the fail mode local, decisions stay local
// after the store answers a Probe again, while the other servers, probing
// as often, write back the hits they admitted without it: so that the
// store counts every server's before it decides anew. A server probing
// every 250ms goes back to the store within 750ms of its return.
const settleFor = 500 * time.Millisecond

// settles reports whether decisions stay local a while longer after a
// Probe found the store answering again (see settleFor): with the fail
// mode local and a write-back, while the breaker is open, until settleFor
// after the first such Probe.
func (s *Service) settles() bool {
	if s.fail != FailLocal || s.writeBack == nil || !s.br.open() {
		return false
	}
	now := s.br.now().UnixMicro()
	since := s.settling.Load()
	if since == 0 {
		s.settling.Store(now)
		return true
	}
	if now-since < settleFor.Microseconds() {
		return true
	}
	s.settling.Store(0)
	return false
}

// ref ties one store request of a batch to its descriptor and limit.
type ref struct {
	desc  int
	limit *rules.Limit
}

// batch holds the store requests of one decision; batches are pooled so
// that a decision allocates only its keys and its Response.
type batch struct {
	reqs []sluice.Request // enforcing descriptors first, in one TakeAll
	refs []ref
	ds   []sluice.Decision
	// span[i] is the range of descriptor i in reqs.
	span    []span
	key     []byte
	entries []Entry // a descriptor's entries with long values digested
	// blocked are the limits that deny every request (rules.Limit.Block),
	// decided without the store.
	blocked []ref
	// elastic are the limits with throttling: elastic, decided after the
	// others (see Service.elastic).
	elastic []elasticRef
	// tctx is the store timeout of the fail mode local (boundLate).
	tctx deadlineCtx
}

type span struct {
	lo, hi int
	alone  bool // taken on its own: in shadow or quota mode
}

// reset empties b for a request of n descriptors.
func (b *batch) reset(n int) {
	b.reqs, b.refs, b.ds, b.blocked, b.elastic = b.reqs[:0], b.refs[:0], b.ds[:0], b.blocked[:0], b.elastic[:0]
	if cap(b.span) < n {
		b.span = make([]span, n)
	}
	b.span = b.span[:n]
	clear(b.span)
}

// responseOne holds a Response and the Status of a request with one
// descriptor, the common case, in one allocation.
type responseOne struct {
	r Response
	s [1]Status
}

// Decide decides r: each descriptor is matched to its rule, and the limits
// of all descriptors not in shadow mode are taken from the store in one
// atomic TakeAll, so a request denied by one limit consumes none of the
// others. Shadow-mode descriptors are taken on their own and never deny.
// Quota-mode descriptors (Envoy's quota_mode) are taken on their own too,
// and deny only all together: the request is over the limit when every one
// of them is (then the others' hits stay taken).
// An unknown domain or a descriptor without a rule is OK with no limit. A
// descriptor with its own Limit is decided by rules.RequestRule's rule
// instead of the one it matched, when the domain is known.
//
// The only errors are invalid requests (wrapping ErrInvalidRequest). A store
// that fails or takes longer than the store timeout never makes Decide fail
// or wait longer: the fail mode decides, and Response.Mode says which. So
// it does for a request with a limit the store refuses (an error wrapping
// sluice.ErrLimit), which, unlike a failure of the store, never opens the
// circuit breaker for other requests: check rules with the store's
// sluice.LimitChecker (rules.WithCheck) so that none is ever in force.
func (s *Service) Decide(ctx context.Context, r *Request) (*Response, error) {
	for _, st := range s.starters {
		ctx = st.Start(ctx, r)
	}
	resp, err := s.decide(ctx, r)
	if err == nil {
		if s.shadow {
			shadowAll(resp)
		}
		if resp.Mode != ModeStore {
			s.note(resp.Mode)
		}
	}
	for _, o := range s.observers {
		o.Observe(ctx, r, resp, err)
	}
	return resp, err
}

// decide is Decide without the observers, the global shadow mode and the
// accounting.
func (s *Service) decide(ctx context.Context, r *Request) (*Response, error) {
	digest, err := s.caps.validate(r)
	if err != nil {
		return nil, err
	}
	n := len(r.Descriptors)
	resp := newResponse(n)
	set := s.rules()
	if set == nil {
		resp.UnknownDomain = true
		return resp, nil
	}
	replaces, err := match(set, r, resp)
	if err != nil {
		return nil, err
	}
	if resp.UnknownDomain {
		return resp, nil
	}

	b := s.batches.Get().(*batch)
	defer s.release(b)
	b.reset(n)
	s.collect(b, r, resp, replaces, digest)
	if len(b.reqs) == 0 {
		block(resp, b)
		if len(b.elastic) > 0 && overall(resp) == OK {
			tctx, cancel := s.boundLate(ctx, b)
			s.elastic(ctx, tctx, r, resp, b)
			cancel()
		}
		resp.Overall = overall(resp)
		if resp.Overall == OK {
			s.admitStep(ctx, r, resp)
		}
		return resp, nil
	}
	if cap(b.ds) < len(b.reqs) {
		b.ds = make([]sluice.Decision, len(b.reqs))
	}
	b.ds = b.ds[:len(b.reqs)]

	tctx, cancel := s.boundLate(ctx, b)
	defer cancel()
	s.takeBatch(ctx, tctx, resp, b)
	block(resp, b)
	if len(b.elastic) > 0 && overall(resp) == OK {
		s.elastic(ctx, tctx, r, resp, b)
	}
	resp.Overall = overall(resp)
	if resp.Overall == OK {
		s.admitStep(ctx, r, resp)
	}
	return resp, nil
}

// newResponse returns a Response of n statuses, all OK; the common
// request of one descriptor takes one allocation.
func newResponse(n int) *Response {
	var resp *Response
	if n == 1 {
		ro := new(responseOne)
		resp = &ro.r
		resp.Statuses = ro.s[:]
	} else {
		resp = &Response{Statuses: make([]Status, n)}
	}
	resp.Overall = OK
	for i := range resp.Statuses {
		resp.Statuses[i].Code = OK
	}
	return resp
}

// takeBatch takes b.reqs with take: the enforcing descriptors, first in
// b.reqs, in one call, then each descriptor taken alone (in shadow or
// quota mode) in one of its own. A blocking limit of an enforcing
// descriptor denies the request: the others then take nothing and only
// report what is left, as when a limit of the TakeAll denies.
func (s *Service) takeBatch(ctx, tctx context.Context, resp *Response, b *batch) {
	main := 0
	for main < len(b.refs) && !b.span[b.refs[main].desc].alone {
		main++
	}
	for _, br := range b.blocked {
		if st := &resp.Statuses[br.desc]; !st.Shadow && !st.Rule.QuotaMode {
			for k := range b.reqs[:main] {
				b.reqs[k].Cost = 0
			}
			break
		}
	}
	if main > 0 {
		s.take(ctx, tctx, resp, b, 0, main, false)
	}
	for lo := main; lo < len(b.reqs); {
		desc := b.refs[lo].desc
		hi := b.span[desc].hi
		s.take(ctx, tctx, resp, b, lo, hi, resp.Statuses[desc].Shadow)
		lo = hi
	}
}

// match writes the rule each descriptor of r matches (rules.RequestRule's
// for one with its own Limit) into resp's statuses, and reports whether a
// limit of them replaces others by name. In a domain the rules do not
// define, it sets resp.UnknownDomain and stops.
func match(set *rules.Set, r *Request, resp *Response) (replaces bool, err error) {
	for i := range r.Descriptors {
		rule, err := set.Match(r.Domain, r.Descriptors[i].Entries)
		if errors.Is(err, rules.ErrUnknownDomain) {
			resp.UnknownDomain = true
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("%w: descriptor %d: %w", ErrInvalidRequest, i, err)
		}
		if rl := r.Descriptors[i].Limit; rl != nil {
			if rule, err = rules.RequestRule(r.Domain, rule, r.Descriptors[i].Entries, *rl); err != nil {
				return false, fmt.Errorf("%w: descriptor %d: limit: %w", ErrInvalidRequest, i, err)
			}
		}
		resp.Statuses[i].Rule = rule
		if rule != nil {
			resp.Statuses[i].Shadow = rule.ShadowMode
			for _, l := range rule.Limits {
				replaces = replaces || len(l.Replaces) > 0
			}
		}
	}
	return replaces, nil
}

// overall returns the verdict on a request from its descriptors' statuses:
// OverLimit if one that is in neither shadow nor quota mode is, or if every
// quota-mode one is (Envoy's quota_mode: a quota descriptor over its limit
// denies only when no other quota descriptor of the request has room).
func overall(resp *Response) Code {
	quota, over := 0, 0
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Rule != nil && st.Rule.QuotaMode && !st.Shadow {
			quota++
			if st.Code == OverLimit {
				over++
			}
			continue
		}
		if st.Code == OverLimit {
			return OverLimit
		}
	}
	if quota > 0 && over == quota {
		return OverLimit
	}
	return OK
}

// block writes the statuses of the descriptors whose limit denies every
// request (rules.Limit.Block, Envoy's requests_per_unit: 0): over the
// limit, nothing remaining, reset after the limit's period (Envoy's
// duration_until_reset: the window's end) but no retry time (sluice.Never:
// waiting never lets the request pass, so HTTP answers carry no
// Retry-After); in shadow mode OK and ShadowOverLimit.
func block(resp *Response, b *batch) {
	for _, br := range b.blocked {
		st := &resp.Statuses[br.desc]
		st.decide(br.limit, sluice.Decision{ResetAfter: br.limit.Limit.Period, RetryAfter: sluice.Never})
	}
}

// release returns b to the pool without the keys and limits it refers to.
func (s *Service) release(b *batch) {
	clear(b.reqs)
	clear(b.refs)
	clear(b.blocked)
	clear(b.elastic)
	clear(b.entries[:cap(b.entries)])
	b.tctx = deadlineCtx{}
	s.batches.Put(b)
}

// validate checks what Decide needs of a request, and that it is within
// the caps, and reports whether a value of it is kept in store keys as a
// digest.
func (c *caps) validate(r *Request) (digest bool, err error) {
	switch {
	case r == nil:
		return false, fmt.Errorf("%w: no request", ErrInvalidRequest)
	case r.Domain == "":
		return false, fmt.Errorf("%w: no domain", ErrInvalidRequest)
	case len(r.Domain) > c.value:
		return false, fmt.Errorf("%w: domain of %d bytes, more than the cap of %d", ErrInvalidRequest, len(r.Domain), c.value)
	case len(r.Descriptors) == 0:
		return false, fmt.Errorf("%w: no descriptors", ErrInvalidRequest)
	case len(r.Descriptors) > c.descriptors:
		return false, fmt.Errorf("%w: %d descriptors, more than the cap of %d per request", ErrInvalidRequest, len(r.Descriptors), c.descriptors)
	}
	for i := range r.Descriptors {
		d := &r.Descriptors[i]
		switch {
		case len(d.Entries) > c.entries:
			return false, fmt.Errorf("%w: descriptor %d: %d entries, more than the cap of %d per descriptor", ErrInvalidRequest, i, len(d.Entries), c.entries)
		case d.Cost < 0:
			return false, fmt.Errorf("%w: descriptor %d: negative cost %d", ErrInvalidRequest, i, d.Cost)
		}
		for j := range d.Entries {
			e := &d.Entries[j]
			switch {
			case len(e.Key) > c.value:
				return false, fmt.Errorf("%w: descriptor %d: entry %d: key of %d bytes, more than the cap of %d", ErrInvalidRequest, i, j, len(e.Key), c.value)
			case len(e.Value) > c.value:
				return false, fmt.Errorf("%w: descriptor %d: entry %d: value of %d bytes, more than the cap of %d", ErrInvalidRequest, i, j, len(e.Value), c.value)
			}
			digest = digest || c.digests(e.Value)
		}
	}
	return digest, nil
}

// collect appends the store requests of every limited descriptor to b:
// those that enforce first, then those taken alone (in shadow or quota
// mode), each descriptor's limits
// together. A limit that another limit of the request replaces (Envoy's
// `replaces`) is left out, as are unlimited ones.
func (s *Service) collect(b *batch, r *Request, resp *Response, replaces, digest bool) {
	for pass := range 2 {
		alone := pass == 1
		for i := range r.Descriptors {
			rule := resp.Statuses[i].Rule
			if rule == nil || (rule.ShadowMode || rule.QuotaMode) != alone || len(rule.Limits) == 0 {
				continue
			}
			d := &r.Descriptors[i]
			lo := len(b.reqs)
			client := -1 // end of the client part in b.key
			for _, l := range rule.Limits {
				if l.Unlimited || (replaces && replaced(l, resp)) {
					continue
				}
				if l.Block {
					b.blocked = append(b.blocked, ref{desc: i, limit: l})
					continue
				}
				if client < 0 {
					entries := d.Entries
					if digest {
						b.entries = s.caps.appendDigested(b.entries[:0], entries)
						entries = b.entries
					}
					b.key = appendClient(b.key[:0], rule, l, entries)
					client = len(b.key)
				}
				b.key = append(append(b.key[:client], l.ID...), b.key[:client]...)
				key := string(b.key[client:])
				group := key[len(l.ID):]
				if l.Throttling == rules.Elastic {
					b.elastic = append(b.elastic, elasticRef{ref: ref{desc: i, limit: l}, key: key, group: group, cost: d.Cost})
					continue
				}
				req := sluice.Request{Key: key, Group: group, Limit: l.Enforced(), Cost: d.Cost, Sync: l.Sync, Scope: l.Scope}
				if rule.EnvoyKeyed(l) {
					req.Envoy = rule.EnvoyDescriptor(d.Entries)
				}
				b.reqs = append(b.reqs, req)
				b.refs = append(b.refs, ref{desc: i, limit: l})
			}
			b.span[i] = span{lo: lo, hi: len(b.reqs), alone: alone}
		}
	}
}

// replaced reports whether a limit of the request's matched rules replaces
// l by name.
func replaced(l *rules.Limit, resp *Response) bool {
	if l.Name == "" {
		return false
	}
	for i := range resp.Statuses {
		rule := resp.Statuses[i].Rule
		if rule == nil {
			continue
		}
		for _, o := range rule.Limits {
			for _, name := range o.Replaces {
				if name == l.Name {
					return true
				}
			}
		}
	}
	return false
}

// take decides b.reqs[lo:hi] in one TakeAll on the store, or, when the
// store does not decide them, as fallback says, and writes the statuses of
// their descriptors. ctx is the caller's context, tctx the one bounded by
// the store timeout.
func (s *Service) take(ctx, tctx context.Context, resp *Response, b *batch, lo, hi int, shadow bool) {
	reqs, ds := b.reqs[lo:hi], b.ds[lo:hi]
	o := s.decideFrom(ctx, tctx, resp, reqs, ds)
	switch {
	case o == decided:
		s.settle(resp, b, lo, hi)
	case o == denied && !shadow:
		s.deny(resp, b, lo, hi)
	}
	// Admitted, and a shadow descriptor that cannot be decided: OK with no
	// limit, as the statuses already say.
}

// outcome is how the requests of one store call were decided.
type outcome uint8

const (
	decided  outcome = iota // by the store, or the local store: their decisions are in ds
	failed                  // the store failed, refused a limit, or the breaker kept it away
	slow                    // the store did not answer within the store timeout
	denied                  // by the fallback: denied
	admitted                // by the fallback: admitted
)

// fallback decides reqs that the store did not (o is failed or slow),
// notes the mode in resp, and returns decided (locally, into ds), denied
// or admitted. With FailOpen and FailClosed, a store that is slow but
// alive keeps its limits: what it did not answer in time is denied. A
// failing store, and one the breaker keeps away, is decided by the fail
// mode.
func (s *Service) fallback(ctx context.Context, resp *Response, reqs []sluice.Request, ds []sluice.Decision, o outcome) outcome {
	if o == slow && s.fail != FailLocal {
		resp.Mode = ModeSlow
		return denied
	}
	resp.Mode = s.fallbackMode
	switch s.fail {
	case FailLocal:
		return s.local(resp, reqs, ds, false)
	case FailClosed:
		return denied
	}
	return admitted
}

// fromStore takes reqs from the store in one TakeAll into ds, when the
// circuit breaker lets it, and returns decided, slow (the store timeout
// passed first) or failed. It tells the breaker how the call went: a store
// error that wraps sluice.ErrLimit, or the caller giving up (ctx), is not
// counted against the store.
func (s *Service) fromStore(ctx, tctx context.Context, reqs []sluice.Request, ds []sluice.Decision) outcome {
	ok, probe := s.br.allow()
	if !ok {
		return failed
	}
	var start time.Time
	if s.timeout > 0 || s.learns {
		start = s.br.now()
	}
	sent := s.ledger.epoch.Load()
	err := s.store.TakeAll(tctx, reqs, ds)
	switch {
	case err == nil:
		s.br.success(probe)
		if s.timeout > 0 {
			s.latency.observe(s.br.now().Sub(start))
		}
		if s.learns {
			s.learn(reqs, ds, s.br.now().UnixMicro(), sent, start.UnixMicro())
		}
		return decided
	case ctx.Err() != nil: // the caller gave up: not the store's fault
		s.br.cancel(probe)
	case errors.Is(err, sluice.ErrLimit):
		// A limit of this request the store cannot apply: the
		// store is fine, and other requests must not lose it.
		s.br.cancel(probe)
		s.log.Debug("store refused a limit", "err", err, "fail", s.fail)
	case timedOut(tctx, err): // the store timeout passed: slow, not down
		s.br.failure(probe, err, true)
		s.latency.observe(s.latency.now()) // at least that long
		s.log.Debug("store slow", "err", err, "timeout", s.latency.now())
		return slow
	default:
		s.br.failure(probe, err, false)
		s.log.Debug("store failed", "err", err, "fail", s.fail)
	}
	return failed
}

// timedOut reports whether err ended a store call bounded by tctx because
// its time was up: tctx's deadline passed, or the store reports a timeout
// of its own (which may come a moment before tctx's timer fires).
func timedOut(tctx context.Context, err error) bool {
	if tctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// settle writes the statuses of the descriptors of b.reqs[lo:hi] from
// their decisions: the binding limit of each descriptor is one that denies
// (the longest wait) or else the one with the least remaining.
//
// When a limit denied, the TakeAll took nothing, but the store reports the
// others as it would have decided them, with their hits taken: their
// Remaining gets the cost back, so that it tells what is really left (for
// an allowed decision Remaining is exactly what was left less the cost, in
// every algorithm). A request counted Envoy's way (Config.EnvoyKeys) kept
// its hits: its Remaining stays as counted.
func (s *Service) settle(resp *Response, b *batch, lo, hi int) {
	denied := false
	for k := lo; k < hi; k++ {
		denied = denied || !b.ds[k].Allowed
	}
	for k := lo; k < hi; {
		i := b.refs[k].desc
		st := &resp.Statuses[i]
		end := b.span[i].hi
		var best sluice.Decision
		var bestLimit *rules.Limit
		for ; k < end; k++ {
			l := b.refs[k].limit
			d := b.ds[k]
			if denied && d.Allowed && !(s.envoyKeys && b.reqs[k].Envoy.Domain != "") {
				d.Remaining = min(d.Remaining+b.reqs[k].Cost, d.Limit)
			}
			d = nominal(l, d)
			if bestLimit == nil || binds(d, best) {
				best, bestLimit = d, l
			}
		}
		st.decide(bestLimit, best)
	}
}

// decide writes limit l's decision d into st: the code is OK when d
// allows; when d denies, OK with ShadowOverLimit in shadow mode, else
// OverLimit.
func (st *Status) decide(l *rules.Limit, d sluice.Decision) {
	st.Limit, st.Decision = l, d
	switch {
	case d.Allowed:
		st.Code = OK
	case st.Shadow:
		st.Code, st.ShadowOverLimit = OK, true
	default:
		st.Code = OverLimit
	}
}

// deny writes OverLimit statuses for the descriptors of b.reqs[lo:hi], as
// fallback denies them: each reports its first limit, nothing remaining,
// and the breaker's cool-down as the time to retry.
func (s *Service) deny(resp *Response, b *batch, lo, hi int) {
	for k := lo; k < hi; k = b.span[b.refs[k].desc].hi {
		st := &resp.Statuses[b.refs[k].desc]
		l := b.refs[k].limit
		st.Code, st.Limit = OverLimit, l
		st.Decision = sluice.Decision{Limit: l.Limit.Capacity(), ResetAfter: s.coolDown, RetryAfter: s.coolDown}
	}
}

// binds reports whether decision a binds tighter than b: a denies and b
// does not, both deny and a waits longer, or both allow and a has less
// remaining.
func binds(a, b sluice.Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// nominal restates a decision the store took under l.Enforced() in terms
// of l as the rules state it: with soft throttling, Limit is the nominal
// capacity and Remaining what is left of it (zero once the request eats
// into the excess).
func nominal(l *rules.Limit, d sluice.Decision) sluice.Decision {
	if l.Throttling != rules.Soft {
		return d
	}
	c := l.Limit.Capacity()
	d.Remaining = max(d.Remaining-(d.Limit-c), 0)
	d.Limit = c
	return d
}
