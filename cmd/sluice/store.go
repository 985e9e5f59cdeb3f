package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// storeOptions are the flags that shape a store.
type storeOptions struct {
	maxEntries int          // memory store: most keys held
	nearCache  int64        // Redis: the near cache's bytes; 0 turns it off
	log        *slog.Logger // warns while a Redis store is not connected
}

// openedStore is the store that --store names, the in-process store that
// --fail local falls back to, and how to close both.
type openedStore struct {
	store sluice.Store
	local sluice.Store
	near  *localfirst.Store // the near cache in store, or nil
	close func() error
}

// openStore opens the store that spec names: "memory" (or "memory://"),
// the embedded default, or a Redis by URL (redis://, rediss://,
// redis+cluster://, rediss+cluster://, redis+sentinel://), with an
// in-process memory store beside it for --fail local.
func openStore(spec string, o storeOptions) (*openedStore, error) {
	scheme := spec
	if i := strings.Index(spec, "://"); i >= 0 {
		scheme = spec[:i]
		if _, err := url.Parse(spec); err != nil {
			return nil, fmt.Errorf("--store %q: %w", spec, err)
		}
	}
	switch strings.ToLower(scheme) {
	case "":
		return nil, errNoStore
	case "memory":
		mem, err := newMemory(o)
		if err != nil {
			return nil, err
		}
		// The memory store cannot fail, so it is its own local fallback.
		return &openedStore{store: mem, local: mem, close: mem.Close}, nil
	case "redis", "rediss", "redis+sentinel", "redis+cluster", "rediss+cluster":
		// A Redis that does not answer yet is no reason not to start: the
		// fail mode decides until it does.
		attempts := 0
		rs, err := redis.OpenBackground(spec, redis.DefaultConfig(), time.Second, func(err error) {
			if attempts%60 == 0 && o.log != nil { // the first, then once a minute
				o.log.Warn("store not connected; deciding by --fail until it is", "err", err, "attempts", attempts+1)
			}
			attempts++
		})
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		mem, err := newMemory(o)
		if err != nil {
			return nil, errors.Join(err, rs.Close())
		}
		closeBoth := func() error { return errors.Join(rs.Close(), mem.Close()) }
		if o.nearCache <= 0 {
			return &openedStore{store: rs, local: mem, close: closeBoth}, nil
		}
		// Redis is out of process: a denied client is answered here until
		// its retry time (store/localfirst's near cache, exact).
		near, err := localfirst.New(rs, localfirst.Config{NearCacheBytes: o.nearCache})
		if err != nil {
			return nil, errors.Join(err, closeBoth())
		}
		return &openedStore{store: near, local: mem, near: near, close: closeBoth}, nil
	}
	return nil, fmt.Errorf("--store %q: unknown store (want memory or a redis:// URL)", spec)
}

// newMemory returns a memory store bounded by o.maxEntries.
func newMemory(o storeOptions) (*memory.Store, error) {
	cfg := memory.DefaultConfig()
	if o.maxEntries > 0 {
		cfg.MaxEntries = o.maxEntries
	}
	mem, err := memory.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	return mem, nil
}

// errNoStore is returned for an empty --store.
var errNoStore = errors.New("--store is empty (want memory)")
