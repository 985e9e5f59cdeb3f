package redis

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"
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
	out  []byte   // n records: the states found, if it replays, or decisions
	now  int64    // the script's time, µs
	// allowed is the script's decision, when c replays, which the replay
	// must agree with
	allowed bool
	err     error
	done    chan struct{}

	keysBuf [1]string
	blobBuf [headerSize + requestSize]byte
}

// run decides c. When nothing else is in flight or queued (a light load),
// it runs c's script call itself, sparing two goroutine hand-offs;
// otherwise it queues c for the workers' next batch and waits.
func (s *Store) run(ctx context.Context, c *call) error {
	if err := s.connected(); err != nil {
		return err
	}
	if len(s.calls) == 0 && s.inFlight.CompareAndSwap(0, 1) {
		err := s.direct(ctx, c)
		s.inFlight.Add(-1)
		return err
	}
	if err := s.submit(ctx, c); err != nil {
		return err
	}
	return s.wait(ctx, c)
}

// bound gives ctx the store's Timeout when it has no deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// direct runs c's script call in the caller's goroutine.
func (s *Store) direct(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	now, err := s.now()
	if err != nil {
		return err
	}
	rep := repeats(c.keys, nil)
	r := s.client.Do(ctx, s.evalsha(c.keys, now, c.blob, rep))
	if err, ok := rueidis.IsRedisErr(r.Error()); ok && err.IsNoScript() {
		r = s.client.Do(ctx, s.eval(c.keys, now, c.blob, rep))
	}
	out, err := r.AsBytes()
	if err != nil {
		return full(err)
	}
	return split([]*call{c}, out)
}

// now returns the script's ARGV[1]: "" for Redis's TIME, or Config.Now in
// µs.
func (s *Store) now() (string, error) {
	if s.cfg.Now == nil {
		return "", nil
	}
	us := s.cfg.Now().UnixMicro()
	if us >= maxExact || us <= -maxExact {
		return "", fmt.Errorf("clock %d µs: beyond the script's exact range (±2^52 µs)", us)
	}
	return strconv.FormatInt(us, 10), nil
}

// submit queues c for the next batch.
func (s *Store) submit(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.calls <- c:
	default: // the queue is full: wait for room
		select {
		case s.calls <- c:
		case <-s.stop:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// A Close that drained the queue before c entered it leaves c to
	// whoever sees it closed.
	if s.closed.Load() {
		s.drain()
	}
	return nil
}

// drain finishes every queued call with ErrClosed.
func (s *Store) drain() {
	for {
		select {
		case c := <-s.calls:
			s.finish([]*call{c}, nil, ErrClosed)
		default:
			return
		}
	}
}

// wait waits until c is decided or ctx is done. Every call queued gets
// decided: by a worker, with an error at its script call's deadline
// (Config.Timeout after the call leaves when its context has none, which
// spares a timer per decision), or with ErrClosed by Close. A context
// that cannot end makes it a plain channel receive.
func (s *Store) wait(ctx context.Context, c *call) error {
	done := ctx.Done()
	if done == nil {
		<-c.done
		return c.err
	}
	select {
	case <-c.done:
		return c.err
	case <-done:
		return ctx.Err()
	}
}

// worker gathers queued calls into a batch of at most Config.MaxBatch
// decisions and runs it, until the store closes. While one worker's
// script calls are in flight, the others gather the calls that arrive
// meanwhile, so batches grow with the load; and while any are in flight, a
// worker waits up to Config.BatchWindow for more before it sends.
func (s *Store) worker() {
	defer s.wg.Done()
	var b batch
	for {
		var first *call
		select {
		case first = <-s.calls:
		case <-s.stop:
			return
		}
		b.calls = append(b.calls[:0], first)
		size := s.gather(&b, first.n)
		if size < s.cfg.MaxBatch && s.cfg.BatchWindow > 0 && s.inFlight.Load() > 0 {
			// Yield to the goroutines about to ask (those the last batch
			// answered) and take what they queue, until a yield brings
			// nothing or the window ends: a timer would cost more than
			// it saves.
			until := time.Now().Add(s.cfg.BatchWindow)
			for size < s.cfg.MaxBatch && time.Now().Before(until) {
				runtime.Gosched()
				n := s.gather(&b, size)
				if n == size {
					break
				}
				size = n
			}
		}
		s.inFlight.Add(1)
		s.exec(&b)
		s.inFlight.Add(-1)
	}
}

// gather adds the queued calls to b, which carries size decisions, until
// it carries Config.MaxBatch, without waiting, and returns its new size.
func (s *Store) gather(b *batch, size int) int {
	for size < s.cfg.MaxBatch {
		select {
		case c := <-s.calls:
			b.calls = append(b.calls, c)
			size += c.n
		default:
			return size
		}
	}
	return size
}

// batch is a worker's scratch space for one batch, reused.
type batch struct {
	calls  []*call
	groups []group
	bySlot map[uint16]int
	seen   map[string]struct{} // for repeats
}

// group is the calls of one batch on one slot: one script call.
type group struct {
	calls []*call
	keys  []string
	blob  []byte
	takes int // offset in blob of the header of the Takes last added, or -1

	repeats bool // a key occurs more than once in keys
}

// add adds c's keys and requests to g. A Take of the same limit and cost
// as the Takes added last joins their group (mode 0: one request record
// for n keys), which spares the script a record to unpack per decision.
func (g *group) add(c *call) {
	g.calls = append(g.calls, c)
	g.keys = append(g.keys, c.keys...)
	if c.blob[0] != modeWrite {
		g.blob = append(g.blob, c.blob...)
		g.takes = -1
		return
	}
	if g.takes >= 0 && bytes.Equal(g.blob[g.takes+headerSize:], c.blob[headerSize:]) {
		n := binary.LittleEndian.Uint32(g.blob[g.takes+1:])
		binary.LittleEndian.PutUint32(g.blob[g.takes+1:], n+1)
		return
	}
	g.takes = len(g.blob)
	g.blob = append(g.blob, c.blob...)
}

// repeats reports whether a key occurs more than once in keys, using seen
// (cleared first; nil makes one) for long lists.
func repeats(keys []string, seen map[string]struct{}) bool {
	if len(keys) <= 8 {
		for i, k := range keys {
			if slices.Contains(keys[:i], k) {
				return true
			}
		}
		return false
	}
	if seen == nil {
		seen = make(map[string]struct{}, len(keys))
	} else {
		clear(seen)
	}
	for _, k := range keys {
		if _, ok := seen[k]; ok {
			return true
		}
		seen[k] = struct{}{}
	}
	return false
}

// exec runs batch: one script call per slot, pipelined together, and hands
// each call its results. Calls whose context is done are left out. The
// batch's deadline is the latest of its calls'.
func (s *Store) exec(b *batch) {
	var deadline, noDeadline time.Time // noDeadline: Config.Timeout from now, once needed
	ng := 0
	if b.bySlot == nil {
		b.bySlot = make(map[uint16]int)
		b.seen = make(map[string]struct{})
	}
	clear(b.bySlot)
	for _, c := range b.calls {
		if c.ctx.Err() != nil {
			continue
		}
		d, ok := c.ctx.Deadline()
		if !ok {
			if noDeadline.IsZero() {
				noDeadline = time.Now().Add(s.cfg.Timeout)
			}
			d = noDeadline
		}
		if d.After(deadline) {
			deadline = d
		}
		g, ok := b.bySlot[c.slot]
		if !ok {
			g = ng
			ng++
			b.bySlot[c.slot] = g
			if g == len(b.groups) {
				b.groups = append(b.groups, group{})
			}
			gr := &b.groups[g]
			gr.calls, gr.keys, gr.blob, gr.takes = gr.calls[:0], gr.keys[:0], gr.blob[:0], -1
		}
		b.groups[g].add(c)
	}
	groups := b.groups[:ng]
	clear(b.calls) // drop the references until the next batch
	if ng == 0 {
		return
	}
	now, err := s.now()
	if err != nil {
		for i := range groups {
			s.finish(groups[i].calls, nil, err)
		}
		return
	}
	ctx, cancel := context.WithDeadline(s.base, deadline)
	defer cancel()
	// rueidis may still read the commands after DoMulti returned at the
	// deadline: they are never reused.
	cmds := make(rueidis.Commands, 0, ng)
	for i := range groups {
		g := &groups[i]
		g.repeats = repeats(g.keys, b.seen)
		cmds = append(cmds, s.evalsha(g.keys, now, g.blob, g.repeats))
	}
	results := doScripts(ctx, s.client, cmds, func(i int) rueidis.Completed {
		return s.eval(groups[i].keys, now, groups[i].blob, groups[i].repeats)
	})
	for i, r := range results {
		out, err := r.AsBytes()
		s.finish(groups[i].calls, out, full(err))
		clear(groups[i].calls)
	}
}

// evalsha and eval build the script call for keys and the packed
// requests; repeats says whether a key occurs twice in keys.
func (s *Store) evalsha(keys []string, now string, blob []byte, repeats bool) rueidis.Completed {
	return s.client.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).
		Arg(now, s.marginArg(), string(blob), flag(repeats)).Build()
}

// marginArg is the scripts' margin argument, in ms: Config.ExpiryMargin,
// plus a random part of half Config.ExpiryJitter (a string state's TTL is
// its reset time and twice the margin: see take.lua).
func (s *Store) marginArg() string {
	if s.cfg.ExpiryJitter <= 1 {
		return s.margin
	}
	return strconv.FormatInt((s.cfg.ExpiryMargin + rand.N(s.cfg.ExpiryJitter)/2).Milliseconds(), 10)
}

func (s *Store) eval(keys []string, now string, blob []byte, repeats bool) rueidis.Completed {
	return s.client.B().Eval().Script(takeScript).Numkeys(int64(len(keys))).Key(keys...).
		Arg(now, s.marginArg(), string(blob), flag(repeats)).Build()
}

// flag is the script's ARGV[4].
func flag(repeats bool) string {
	if repeats {
		return "1"
	}
	return ""
}

// finish hands each call its part of out, the output of the calls'
// script call, or err.
func (s *Store) finish(calls []*call, out []byte, err error) {
	if err == nil {
		err = split(calls, out)
	}
	for _, c := range calls {
		if err != nil {
			c.err = err
		}
		c.done <- struct{}{}
	}
}
