package redis

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
)

// TakeState decides r as TakeAll does a batch of one, and also returns
// the key's state after the decision and the script's time it decided at
// (µs since the Unix epoch, Redis's TIME or Config.Now), for a decorator
// that answers later requests on the key from that state
// (store/localfirst). ok is false for a sliding_log, whose state the
// script does not return, and for requests decided without Redis.
func (s *Store) TakeState(ctx context.Context, r sluice.Request) (d sluice.Decision, st sluice.State, now int64, ok bool, err error) {
	key, l, cost := r.Key, r.Limit, r.Cost
	if err := ctx.Err(); err != nil {
		return d, st, 0, false, fmt.Errorf("redis take %s: %w", key, err)
	}
	if d, ok := local(l, cost); ok {
		return d, st, 0, false, nil
	}
	c := &call{n: 1, done: make(chan struct{}, 1)}
	if err := s.prepare(c, ctx, s.name(key, r.Group), l, cost); err != nil {
		return d, st, 0, false, fmt.Errorf("redis take %s: %w", key, err)
	}
	if err := s.run(ctx, c); err != nil {
		return d, st, 0, false, fmt.Errorf("redis take %s: %w", key, err)
	}
	d, st, ok, err = c.result(l, cost)
	if err != nil {
		return sluice.Decision{}, st, 0, false, fmt.Errorf("redis take %s: %w", key, err)
	}
	if !ok {
		return d, st, 0, false, nil
	}
	return d, st, c.now, true, nil
}
