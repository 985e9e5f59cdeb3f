package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestFull runs a Redis under the noeviction policy that the shipped
// manifests and compose file set, and puts it past its maxmemory (CONFIG
// SET maxmemory 1: every write is refused): a decision, alone (Take) or
// in a batch (TakeAll), fails with an error that wraps sluice.ErrStoreFull
// and keeps Redis's OOM text, and the count taken before is still there,
// neither evicted nor counted again, once memory is given back.
func TestFull(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	s := open(t, "redis://"+r.Addr, testConfig(nil))
	ctx := context.Background()
	l := sluice.Limit{Rate: 5, Period: time.Hour}
	if d, err := sluice.Take(ctx, s, "alice", l, 1); err != nil || d.Remaining != 4 {
		t.Fatalf("Take before the cap = %+v, %v; want 4 remaining", d, err)
	}

	r.Do("CONFIG", "SET", "maxmemory", "1")
	_, err := sluice.Take(ctx, s, "alice", l, 1)
	if !errors.Is(err, sluice.ErrStoreFull) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("Take at the cap: %v, want an error wrapping ErrStoreFull with Redis's OOM", err)
	}
	reqs := []sluice.Request{{Key: "alice", Limit: l, Cost: 1}, {Key: "bob", Limit: l, Cost: 1}}
	if err := s.TakeAll(ctx, reqs, make([]sluice.Decision, len(reqs))); !errors.Is(err, sluice.ErrStoreFull) {
		t.Errorf("TakeAll at the cap: %v, want an error wrapping ErrStoreFull", err)
	}

	r.Do("CONFIG", "SET", "maxmemory", "0")
	if d, err := sluice.Take(ctx, s, "alice", l, 1); err != nil || d.Remaining != 3 {
		t.Errorf("Take after the cap = %+v, %v; want 3 remaining (the first count kept, none counted at the cap)", d, err)
	}
	if _, err := sluice.Take(ctx, s, "carol", l, 1); errors.Is(err, sluice.ErrStoreFull) || err != nil {
		t.Errorf("Take of a new key after the cap: %v", err)
	}
}
