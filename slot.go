package sluice

import (
	"context"
	"time"
)

// Grant is the answer to a SlotCounter's Acquire.
type Grant struct {
	// OK reports that a slot was taken; Token then names it for Release.
	OK    bool
	Token uint64
	// InFlight is how many slots of the key are held, this one included
	// when OK.
	InFlight int64
	// RetryAfter is, when refused, how long until the earliest lease ends:
	// a slot may free sooner, when its holder releases it.
	RetryAfter time.Duration
}

// SlotCounter keeps the requests in flight of concurrency limits (a
// rule's Concurrency): package slots' Memory on one node, store/redis's
// SlotCounter across nodes. Acquire takes a slot of key for at most lease
// unless limit are held; Release gives it back early. Implementations are
// safe for concurrent use.
type SlotCounter interface {
	Acquire(ctx context.Context, key string, limit int64, lease time.Duration) (Grant, error)
	Release(ctx context.Context, key string, token uint64) error
}
