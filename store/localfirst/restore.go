package localfirst

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
)

// Restorer is an optional interface of a store that puts back counts it
// lost (Redis restarted without persistence, or failed over to a replica
// that lagged), as a server knew them. store/redis implements it.
type Restorer interface {
	// RestoreCounts raises the count of reqs[i].Limit, a window limit,
	// on reqs[i].Key in the window that starts at windows[i] (µs on the
	// store's clock) to reqs[i].Cost where it is lower, leaving a count
	// at or above it alone, and returns the store's time (µs).
	RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) (int64, error)
}

// restoreChunk is the most keys one RestoreCounts call carries: a
// restore of a large table goes in several script calls, none of which
// holds Redis long.
const restoreChunk = 1000

// lost records that the store counted less than this node had read of a
// key in the same window: it lost keys (restarted empty). The next sync
// puts back what the node holds (restore). mu of the key's shard is held
// or not; it is safe for concurrent use.
func (s *Store) lost() { s.lostCounts.Store(true) }

// restoreIfLost puts back the counts the node holds if the store was
// seen to have lost some since the last restore.
func (s *Store) restoreIfLost(ctx context.Context) error {
	if s.restorer == nil || !s.lostCounts.Swap(false) {
		return nil
	}
	if err := s.restore(ctx); err != nil {
		s.lostCounts.Store(true) // again at the next sync
		return err
	}
	return nil
}

// restore writes back, merged by maximum (Restorer), every count of a
// window limit the node holds: the near cache's denials (the state the
// store's denial left), the leases' grants not yet returned (the state the
// grant left), a lease key's highest count the store showed in its window
// (heldCount: other nodes' leases given back since may have lowered it, by
// their size at most), and async mode's counts of fixed_window keys (what the
// store counted at the key's last sync, the node's own hits written up to
// it included). What the node admitted since and has not written yet is
// written by the next sync, as always. A key no server holds starts from
// what the store kept: nothing after an empty restart.
func (s *Store) restore(ctx context.Context) error {
	reqs, windows := s.held()
	keys := len(reqs)
	for len(reqs) > 0 {
		n := min(len(reqs), restoreChunk)
		s.calls.Add(1)
		if _, err := s.restorer.RestoreCounts(ctx, reqs[:n], windows[:n]); err != nil {
			return fmt.Errorf("localfirst restore: %w", err)
		}
		s.restored.Add(uint64(n))
		reqs, windows = reqs[n:], windows[n:]
	}
	s.log.Info("put back counts the store lost, as this server's local-first layer held them", "keys", keys)
	return nil
}

// held returns the counts of window limits the node holds, as requests
// whose Cost is the count and the windows they count in (a
// sliding_window's previous window too).
func (s *Store) held() ([]sluice.Request, []int64) {
	var reqs []sluice.Request
	var windows []int64
	add := func(id sluice.Request, st sluice.State) {
		if id.Limit.Algorithm.HasBurst() || id.Limit.Algorithm == sluice.SlidingLog {
			return
		}
		t, n, p := st.Fields()
		if n > 0 {
			id.Cost = n
			reqs, windows = append(reqs, id), append(windows, t)
		}
		if p > 0 && id.Limit.Algorithm == sluice.SlidingWindow {
			id.Cost = p
			reqs, windows = append(reqs, id), append(windows, t-id.Limit.Period.Microseconds())
		}
	}
	if c := s.near; c != nil {
		for i := range c.shards {
			sh := &c.shards[i]
			sh.mu.Lock()
			for k, e := range sh.entries {
				add(sluice.Request{Key: k, Group: e.group, Limit: e.limit}, e.state)
			}
			sh.mu.Unlock()
		}
	}
	if ls := s.leases; ls != nil {
		for i := range ls.shards {
			sh := &ls.shards[i]
			sh.mu.Lock()
			for _, e := range sh.m {
				if e.granted > 0 {
					add(e.req, e.st)
				}
				if h := e.held; h.high > 0 {
					add(e.req, sluice.StateOf(h.win, h.high, 0))
				}
			}
			sh.mu.Unlock()
		}
	}
	if a := s.async; a != nil {
		for i := range a.shards {
			sh := &a.shards[i]
			sh.mu.Lock()
			for _, e := range sh.m {
				if e.req.Limit.Algorithm == sluice.FixedWindow {
					add(e.req, sluice.StateOf(e.window, e.counted, 0))
				}
			}
			sh.mu.Unlock()
		}
	}
	return reqs, windows
}
