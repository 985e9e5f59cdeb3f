package regions

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestPassThrough: over a Redis store, a request of scope region reaches
// the abilities of the store as the layers over it ask for them (its
// state, leases, hits written back, the registry of servers); one of scope
// global is decided by its cap, with no state to cache, and is never
// leased nor written back.
func TestPassThrough(t *testing.T) {
	w := newWANWorld(t, 1, 1, false, nil)
	s := w.nodes[0][0]
	ctx := context.Background()
	region := sluice.Request{Key: "r", Limit: perMinute, Cost: 1}
	glob := sluice.Request{Key: "g", Limit: perMinute, Cost: 1, Scope: sluice.GlobalScope}
	if d, _, _, ok, err := s.TakeState(ctx, region); err != nil || !ok || !d.Allowed {
		t.Errorf("scope region: %+v, ok %v, %v; want the store's state", d, ok, err)
	}
	if d, _, _, ok, err := s.TakeState(ctx, glob); err != nil || ok || !d.Allowed || d.Limit != perMinute.Rate {
		t.Errorf("scope global: %+v, ok %v, %v; want decided, no state", d, ok, err)
	}
	if !s.CanLease(perMinute) || !s.Syncable(perMinute) {
		t.Error("the Redis store's leases and write-backs are not passed on")
	}
	if _, _, err := s.SyncCounts(ctx, []sluice.Request{region}, []int64{0}); err != nil {
		t.Errorf("SyncCounts of scope region: %v", err)
	}
	if _, _, err := s.SyncCounts(ctx, []sluice.Request{glob}, []int64{0}); !errors.Is(err, errGlobal) {
		t.Errorf("SyncCounts of scope global: %v, want errGlobal", err)
	}
	if _, err := s.ReturnLeases(ctx, []sluice.Request{glob}, []sluice.State{{}}); !errors.Is(err, errGlobal) {
		t.Errorf("ReturnLeases of scope global: %v, want errGlobal", err)
	}
	if n, err := s.Heartbeat(ctx, "server-1", time.Second); err != nil || n != 1 {
		t.Errorf("Heartbeat: %d servers, %v; want the Redis store's count, 1", n, err)
	}
	if err := s.CheckLimit(sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: 1 << 40 * time.Microsecond, Burst: 1 << 30}); err == nil {
		t.Error("a bucket whose count across regions Redis cannot keep exactly passed the veto")
	}
}
