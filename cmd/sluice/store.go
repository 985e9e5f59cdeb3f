package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// storeOptions are the flags that shape a store.
type storeOptions struct {
	maxEntries int // memory store: most keys held
}

// openedStore is the store that --store names, the in-process store that
// --fail local falls back to, and how to close both.
type openedStore struct {
	store sluice.Store
	local sluice.Store
	close func() error
}

// openStore opens the store that spec names: "memory" (or "memory://"),
// the embedded default. Other stores are named by URL, such as
// redis://host:6379/0; each scheme is one case below.
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
	case "redis", "rediss", "redis+sentinel", "redis+cluster":
		return nil, fmt.Errorf("--store %q: the redis store is not built into this sluice yet; use --store memory", spec)
	}
	return nil, fmt.Errorf("--store %q: unknown store (want memory)", spec)
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
