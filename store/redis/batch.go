package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// call is one group of requests for the script: a Take's one request or a
// TakeAll's requests on one slot. The worker that runs it writes vals and
// err, then signals done; the caller reads them only after done, and
// abandons the call (it is never reused) when its context ends first.
type call struct {
	ctx  context.Context
	slot uint16
	n    int      // requests
	keys []string // n keys, prefixed
	blob []byte   // the group: header and n request records
	out  []byte   // n decision records
	err  error
	done chan struct{}

	keysBuf [1]string
	blobBuf [headerSize + requestSize]byte
}

// run submits c and waits for its result.
func (s *Store) run(ctx context.Context, c *call) error {
	if err := s.submit(ctx, c); err != nil {
		return err
	}
	return s.wait(ctx, c)
}

// submit queues c for the next batch.
func (s *Store) submit(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.calls <- c:
		return nil
	case <-s.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait waits until c is decided, ctx is done or the store closes. A call
// whose context has no deadline is bounded by its script call's deadline,
// Config.Timeout after the call leaves, which spares a timer per decision.
func (s *Store) wait(ctx context.Context, c *call) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return ErrClosed
	}
}

// collect gathers queued calls into batches of at most Config.MaxBatch
// decisions per slot and hands them to the workers. While every worker is
// busy, calls queue up, so batches grow with the load. It returns when the
// store closes.
func (s *Store) collect() {
	defer s.wg.Done()
	pending := make(map[uint16][]*call)
	sizes := make(map[uint16]int)
	var window *time.Timer
	for {
		var first *call
		select {
		case first = <-s.calls:
		case <-s.stop:
			return
		}
		add := func(c *call) bool {
			batch := append(pending[c.slot], c)
			sizes[c.slot] += c.n
			if sizes[c.slot] >= s.cfg.MaxBatch {
				delete(pending, c.slot)
				delete(sizes, c.slot)
				return s.dispatch(batch)
			}
			pending[c.slot] = batch
			return true
		}
		if !add(first) {
			return
		}
		// Wait for more only while script calls are in flight: an idle
		// Redis gets the batch at once, so a light load pays no window.
		var expired <-chan time.Time
		if s.cfg.BatchWindow > 0 && s.inFlight.Load() > 0 {
			if window == nil {
				window = time.NewTimer(s.cfg.BatchWindow)
			} else {
				window.Reset(s.cfg.BatchWindow)
			}
			expired = window.C
		}
	gather:
		for len(pending) > 0 {
			select {
			case c := <-s.calls:
				if !add(c) {
					return
				}
				continue
			case <-s.stop:
				return
			default:
			}
			if expired == nil {
				break
			}
			select {
			case c := <-s.calls:
				if !add(c) {
					return
				}
			case <-expired:
				expired = nil
				break gather
			case <-s.stop:
				return
			}
		}
		if expired != nil {
			window.Stop() // since Go 1.23 no stale tick can remain in window.C
		}
		for slot, batch := range pending {
			delete(pending, slot)
			delete(sizes, slot)
			if !s.dispatch(batch) {
				return
			}
		}
	}
}

// dispatch hands batch to a worker, waiting for one to be free. It
// reports false when the store closes.
func (s *Store) dispatch(batch []*call) bool {
	select {
	case s.work <- batch:
		return true
	case <-s.stop:
		return false
	}
}

// worker runs batches until the store closes.
func (s *Store) worker() {
	defer s.wg.Done()
	var keys []string
	var blob []byte
	for {
		select {
		case batch := <-s.work:
			s.inFlight.Add(1)
			keys, blob = s.exec(batch, keys[:0], blob[:0])
			s.inFlight.Add(-1)
		case <-s.stop:
			return
		}
	}
}

// exec runs one script call for batch, whose calls share a slot, and
// hands each call its results. Calls whose context is done are left out.
// The script call's deadline is the latest of the calls'. keys and blob
// are scratch space, returned for reuse.
func (s *Store) exec(batch []*call, keys []string, blob []byte) ([]string, []byte) {
	var deadline time.Time
	live := batch[:0]
	for _, c := range batch {
		if c.ctx.Err() != nil {
			continue
		}
		d, ok := c.ctx.Deadline()
		if !ok {
			d = time.Now().Add(s.cfg.Timeout)
		}
		if d.After(deadline) {
			deadline = d
		}
		keys = append(keys, c.keys...)
		blob = append(blob, c.blob...)
		live = append(live, c)
	}
	if len(live) == 0 {
		return keys, blob
	}
	now := ""
	if s.cfg.Now != nil {
		us := s.cfg.Now().UnixMicro()
		if us >= maxExact || us <= -maxExact {
			s.finish(live, nil, fmt.Errorf("clock %d µs: %w", us, ErrInexact))
			return keys, blob
		}
		now = strconv.FormatInt(us, 10)
	}
	ctx, cancel := context.WithDeadline(s.base, deadline)
	out, err := s.script.Exec(ctx, s.client, keys, []string{now, s.margin, string(blob)}).AsBytes()
	cancel()
	if err == nil && len(out) != decisionSize*len(keys) {
		err = fmt.Errorf("script returned %d bytes for %d requests", len(out), len(keys))
	}
	s.finish(live, out, err)
	return keys, blob
}

// finish hands each call its part of out, or err.
func (s *Store) finish(calls []*call, out []byte, err error) {
	off := 0
	for _, c := range calls {
		if err != nil {
			c.err = err
		} else {
			c.out = out[off : off+decisionSize*c.n : off+decisionSize*c.n]
			off += decisionSize * c.n
		}
		c.done <- struct{}{}
	}
}
