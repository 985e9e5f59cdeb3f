package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// ErrConnecting is returned by a Background store until its first
// connection to Redis succeeds.
var ErrConnecting = errors.New("redis store not connected yet")

// Background is a Store that connects in the background: until Redis
// first answers, TakeAll fails at once with ErrConnecting, which a
// caller's fail mode decides (package decide), and it keeps trying. So a
// sluice server started while its Redis is down serves in its fail mode and
// moves to Redis by itself, as it does when Redis fails later.
type Background struct {
	store atomic.Pointer[Store]
	last  atomic.Pointer[error] // the last failed attempt's error
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

var (
	_ sluice.Store        = (*Background)(nil)
	_ sluice.LimitChecker = (*Background)(nil)
)

// OpenBackground checks rawURL and cfg (errors no retry can fix are
// returned at once), then tries to connect as Open does, each attempt
// bounded by cfg.DialTimeout (at least 1s), every retry until one succeeds
// or Close is called; failed reports each failure, if not nil. The first attempt is
// made before OpenBackground returns, so that a Redis that answers is used
// from the first decision.
func OpenBackground(rawURL string, cfg Config, retry time.Duration, failed func(error)) (*Background, error) {
	cfg, opt, cluster, err := check(rawURL, cfg)
	if err != nil {
		return nil, err
	}
	if retry <= 0 {
		return nil, fmt.Errorf("redis store: retry must be positive, got %v", retry)
	}
	b := &Background{stop: make(chan struct{}), done: make(chan struct{})}
	attempt := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), max(cfg.DialTimeout, time.Second))
		defer cancel()
		s, err := connect(ctx, rawURL, cfg, opt, cluster)
		if err != nil {
			b.last.Store(&err)
			if failed != nil {
				failed(err)
			}
			return false
		}
		b.store.Store(s)
		return true
	}
	if attempt() {
		close(b.done)
		return b, nil
	}
	go func() {
		defer close(b.done)
		t := time.NewTicker(retry)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				if attempt() {
					return
				}
			}
		}
	}()
	return b, nil
}

// Connected returns the store once connected, or nil.
func (b *Background) Connected() *Store { return b.store.Load() }

// Ready reports whether the store has connected (see decide.Ready).
func (b *Background) Ready() bool { return b.store.Load() != nil }

// notYet is the error of a decision asked before the store connected.
func (b *Background) notYet() error {
	select {
	case <-b.stop:
		return ErrClosed
	default:
	}
	if err := b.last.Load(); err != nil {
		return fmt.Errorf("%w: %w", ErrConnecting, *err)
	}
	return ErrConnecting
}

// TakeAll implements sluice.Store.
func (b *Background) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if s := b.store.Load(); s != nil {
		return s.TakeAll(ctx, reqs, ds)
	}
	return fmt.Errorf("redis take all: %w", b.notYet())
}

// CheckLimit implements sluice.LimitChecker, connected or not: see
// CheckLimit.
func (b *Background) CheckLimit(l sluice.Limit) error { return CheckLimit(l) }

// Close stops connecting and closes the store if it connected. It is safe
// to call more than once.
func (b *Background) Close() error {
	var err error
	b.once.Do(func() {
		close(b.stop)
		<-b.done
		if s := b.store.Load(); s != nil {
			err = s.Close()
		}
	})
	return err
}
