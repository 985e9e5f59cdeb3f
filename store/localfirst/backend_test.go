package localfirst

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// passStore is a layer between local-first and its backend that has no
// ability of its own (as store/regions): it counts the calls that reach it.
type passStore struct {
	next  sluice.Store
	calls atomic.Int64
}

func (p *passStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	p.calls.Add(1)
	return p.next.TakeAll(ctx, reqs, ds)
}

// TestBackendAndDirect: with a layer between local-first and its backend,
// the near cache and leases use Config.Backend's abilities, handed over as
// a value (the layer between passes none on), while the requests Direct
// names go straight to the layer's TakeAll, never leased nor cached.
func TestBackendAndDirect(t *testing.T) {
	clock := clocktest.New(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	backend := newMemStore(clock.Now)
	mid := &passStore{next: backend}
	s, err := New(mid, Config{Sync: Lease, Backend: backend, Now: clock.Now,
		Direct: func(r sluice.Request) bool { return r.Scope == sluice.GlobalScope }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	l := sluice.Limit{Rate: 1000, Period: time.Minute}
	take := func(key string, scope sluice.Scope) {
		var d [1]sluice.Decision
		if err := s.TakeAll(context.Background(), []sluice.Request{{Key: key, Limit: l, Cost: 1, Scope: scope}}, d[:]); err != nil || !d[0].Allowed {
			t.Fatalf("%s: %+v, %v", key, d[0], err)
		}
	}
	for range 20 {
		take("direct", sluice.GlobalScope)
	}
	if got := mid.calls.Load(); got != 20 {
		t.Errorf("the layer between saw %d of 20 direct requests", got)
	}
	if st := s.Stats(); st.Grants != 0 || st.LeaseHits != 0 {
		t.Errorf("direct requests were leased: %+v", st)
	}
	for range 20 {
		take("leased", sluice.RegionScope)
	}
	if st := s.Stats(); st.Grants == 0 || st.LeaseHits == 0 || mid.calls.Load() != 20 {
		t.Errorf("the others were not leased from the backend: %+v, %d calls to the layer between", st, mid.calls.Load())
	}
}
