package redis

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

//go:embed slots.lua
var slotsSource string

// slotsScript runs slots.lua. It is immutable and shared.
var slotsScript = rueidis.NewLuaScript(slotsSource)

// SlotCounter is the sluice.SlotCounter of concurrency limits in Redis, for
// admit's Config.Slots: each key is a sorted set of the holders' tokens
// scored by the ends of their leases, acquired and released by one atomic
// script (slots.lua) on the key's node. A holder is this SlotCounter's
// random node ID and a counter, so that holders of many nodes never
// collide.
//
// A sorted set rather than a counter: a counter cannot tell which holder's
// lease ended, so a node that dies holding slots would leak them until
// the whole key expires, which other holders keep renewing. With one
// member per holder, each slot ends with its own lease whatever happens to
// its node, and a release removes exactly its own. The cost is
// O(log held) per call and one member per request in flight.
//
// SlotCounter is safe for concurrent use; it shares its Store's
// connections and clock (Config.Now, or Redis's TIME).
type SlotCounter struct {
	st    *Store
	node  string
	token atomic.Uint64
}

var _ sluice.SlotCounter = (*SlotCounter)(nil)

// SlotCounter returns a SlotCounter of s; until s has connected, it fails as
// TakeAll does.
func (s *Store) SlotCounter() *SlotCounter { return newSlotCounter(s) }

func newSlotCounter(st *Store) *SlotCounter {
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	return &SlotCounter{st: st, node: hex.EncodeToString(id[:]) + ":"}
}

// store returns the connected store, or ErrConnecting.
func (sl *SlotCounter) store() (*Store, error) {
	if err := sl.st.connected(); err != nil {
		return nil, err
	}
	return sl.st, nil
}

// Acquire implements sluice.SlotCounter: it takes a slot of key for lease
// unless limit are held, dropping expired holders first.
func (sl *SlotCounter) Acquire(ctx context.Context, key string, limit int64, lease time.Duration) (sluice.Grant, error) {
	st, err := sl.store()
	if err != nil {
		return sluice.Grant{}, fmt.Errorf("redis slots %s: %w", key, err)
	}
	now := ""
	if st.cfg.Now != nil {
		now = strconv.FormatInt(st.cfg.Now().UnixMilli(), 10)
	}
	tok := sl.token.Add(1)
	ctx, cancel := st.bound(ctx)
	defer cancel()
	args := []string{"a", sl.member(tok), strconv.FormatInt(limit, 10), strconv.FormatInt(max(lease.Milliseconds(), 1), 10), now}
	vs, err := slotsScript.Exec(ctx, st.client, []string{sl.name(st, key)}, args).ToArray()
	if err != nil {
		return sluice.Grant{}, fmt.Errorf("redis slots %s: %w", key, err)
	}
	if len(vs) < 2 {
		return sluice.Grant{}, fmt.Errorf("redis slots %s: %d values from the script", key, len(vs))
	}
	ok, err1 := vs[0].AsInt64()
	n, err2 := vs[1].AsInt64()
	if err1 != nil || err2 != nil {
		return sluice.Grant{}, fmt.Errorf("redis slots %s: script answered %v %v", key, err1, err2)
	}
	if ok == 1 {
		return sluice.Grant{OK: true, Token: tok, InFlight: n}, nil
	}
	g := sluice.Grant{InFlight: n}
	if len(vs) > 2 {
		if ms, err := vs[2].AsInt64(); err == nil {
			g.RetryAfter = time.Duration(ms) * time.Millisecond
		}
	}
	return g, nil
}

// Release implements sluice.SlotCounter: it removes the slot token of key.
func (sl *SlotCounter) Release(ctx context.Context, key string, token uint64) error {
	st, err := sl.store()
	if err != nil {
		return fmt.Errorf("redis slots release %s: %w", key, err)
	}
	ctx, cancel := st.bound(ctx)
	defer cancel()
	err = slotsScript.Exec(ctx, st.client, []string{sl.name(st, key)}, []string{"r", sl.member(token), "", "", ""}).Error()
	if err != nil {
		return fmt.Errorf("redis slots release %s: %w", key, err)
	}
	return nil
}

// InFlight returns how many slots of key are held and not expired by the
// store's clock, for tests and diagnostics.
func (sl *SlotCounter) InFlight(ctx context.Context, key string) (int64, error) {
	st, err := sl.store()
	if err != nil {
		return 0, err
	}
	var ms int64
	if st.cfg.Now != nil {
		ms = st.cfg.Now().UnixMilli()
	} else {
		t, err := st.client.Do(ctx, st.client.B().Time().Build()).AsStrSlice()
		if err != nil || len(t) < 2 {
			return 0, fmt.Errorf("redis slots time: %v %w", t, err)
		}
		sec, _ := strconv.ParseInt(t[0], 10, 64)
		us, _ := strconv.ParseInt(t[1], 10, 64)
		ms = sec*1000 + us/1000
	}
	n, err := st.client.Do(ctx, st.client.B().Zcount().Key(sl.name(st, key)).Min("("+strconv.FormatInt(ms, 10)).Max("+inf").Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("redis slots %s: %w", key, err)
	}
	return n, nil
}

func (sl *SlotCounter) member(tok uint64) string { return sl.node + strconv.FormatUint(tok, 16) }

// name is the Redis key of the slots of key: the store's prefix, key's
// hash tag, "slots:" and key.
func (sl *SlotCounter) name(st *Store, key string) string { return st.name("slots:"+key, key) }
