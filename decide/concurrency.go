package decide

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/slots"
)

// Slots keeps the requests in flight of concurrency limits (a rule's
// Concurrency): slots.Memory on one node, store/redis's Slots across
// nodes. Acquire takes a slot of key for at most lease unless limit are
// held; Release gives it back early. Implementations are safe for
// concurrent use.
type Slots interface {
	Acquire(ctx context.Context, key string, limit int64, lease time.Duration) (slots.Grant, error)
	Release(ctx context.Context, key string, token uint64) error
}

// held is a slot a Status holds until Response.Done.
type held struct {
	key   string
	token uint64
}

// noID is a limit without an ID: rules.Rule.AppendKey then writes only a
// descriptor's values, which follow the rule's ConcurrencyID in slot keys.
var noID rules.Limit

// acquire takes the concurrency slots of resp's allowed descriptors whose
// rule has a Concurrency, one by one; when one is refused it gives back
// those taken, and the request is over the limit (the hits its rate limits
// took stay taken, as for a request denied by another descriptor). A
// failing Slots is decided by the fail mode: open admits without a slot,
// closed denies, local counts on the node's own slots.Memory. A request
// that will call Done (r.Hold) holds its slots for HoldLease, another for
// Lease.
func (s *Service) acquire(ctx context.Context, r *Request, resp *Response, b *batch, digest bool) {
	lease := s.lease
	if r.Hold {
		lease = s.holdLease
	}
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		rule := st.Rule
		if rule == nil || rule.Concurrency == 0 || r.Descriptors[i].Cost == 0 {
			continue
		}
		entries := r.Descriptors[i].Entries
		if digest {
			b.entries = s.caps.appendDigested(b.entries[:0], entries)
			entries = b.entries
		}
		b.key = append(b.key[:0], rule.ConcurrencyID...)
		b.key = rule.AppendKey(b.key, &noID, entries)
		key := string(b.key)
		store := s.slots
		tctx, cancel := ctx, context.CancelFunc(nil)
		if s.slotTimeout > 0 {
			tctx, cancel = context.WithTimeout(ctx, s.slotTimeout)
		}
		g, err := store.Acquire(tctx, key, rule.Concurrency, lease)
		if err != nil && s.fail == FailLocal && s.localSlots != nil {
			store = s.localSlots
			g, err = store.Acquire(ctx, key, rule.Concurrency, lease)
		}
		if cancel != nil {
			cancel()
		}
		switch {
		case err != nil && s.fail != FailClosed:
			s.log.Debug("slots failed", "err", err, "fail", s.fail)
			resp.Mode = s.fallbackMode
			continue // open: admitted without a slot
		case err != nil:
			s.log.Debug("slots failed", "err", err, "fail", s.fail)
			resp.Mode = s.fallbackMode
			g = slots.Grant{RetryAfter: s.coolDown}
		}
		if g.OK {
			st.slot, st.slots = held{key: key, token: g.Token}, store
			resp.done = s
			continue
		}
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
			continue
		}
		st.Code, st.Limit, st.Concurrency = OverLimit, nil, true
		st.Decision.Allowed, st.Decision.Limit, st.Decision.Remaining = false, rule.Concurrency, 0
		st.Decision.RetryAfter, st.Decision.ResetAfter = retry, retry
		resp.Overall = OverLimit
	}
	if resp.Overall == OverLimit && resp.done != nil {
		s.releaseAll(ctx, resp)
	}
}

// Done gives back the concurrency slots the request holds, at once; a
// caller that asked to hold them (Request.Hold) calls it when the request
// ends, however it ends. Without it they are held until their lease ends.
// ctx bounds the store calls: pass one that outlives a client that is
// gone (context.WithoutCancel). Done is safe to call more than once and on
// a nil Response.
func (r *Response) Done(ctx context.Context) {
	if r == nil || r.done == nil {
		return
	}
	r.done.releaseAll(ctx, r)
}

// releaseAll releases every slot resp holds.
func (s *Service) releaseAll(ctx context.Context, resp *Response) {
	if s.slotTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.slotTimeout)
		defer cancel()
	}
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.slots == nil {
			continue
		}
		if err := st.slots.Release(ctx, st.slot.key, st.slot.token); err != nil {
			s.log.Debug("slot release failed; it frees at the end of its lease", "err", err)
		}
		st.slot, st.slots = held{}, nil
	}
	resp.done = nil
}

// initSlots sets the Service's slots from cfg: Config.Slots, or a
// slots.Memory on cfg.Now's clock; with FailLocal a slots.Memory of its own
// too, unless Slots is one already.
func (s *Service) initSlots(cfg Config) error {
	s.slots, s.lease, s.holdLease = cfg.Slots, cfg.Lease, cfg.HoldLease
	if s.slots == nil {
		m, err := slots.NewMemory(slots.Config{Now: cfg.Now})
		if err != nil {
			return fmt.Errorf("decide: %w", err)
		}
		s.slots = m
	} else {
		s.slotTimeout = max(cfg.StoreTimeout, 0)
		if cfg.Fail == FailLocal {
			m, err := slots.NewMemory(slots.Config{Now: cfg.Now})
			if err != nil {
				return fmt.Errorf("decide: %w", err)
			}
			s.localSlots = m
		}
	}
	return nil
}
