package redis

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// syncTwin is Store.SyncCounts with async.lua run in-process (scriptVM),
// on the memRedis of a twin's take.lua, as a Store outside a cluster.
type syncTwin struct {
	s  *Store
	vm *scriptVM
}

func newSyncTwin(t testing.TB, w *twin, now func() time.Time) *syncTwin {
	vm := newScriptVM(t, asyncSource, now)
	vm.db = w.vm.db
	return &syncTwin{s: w.s, vm: vm}
}

// SyncCounts is Store.SyncCounts, in-process.
func (w *syncTwin) SyncCounts(reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	names, recs, scale, err := w.s.syncRecords(reqs, windows)
	if err != nil {
		return nil, 0, err
	}
	now, err := w.s.now()
	if err != nil {
		return nil, 0, err
	}
	ret, err := w.vm.evalValue(names, string(bytes.Join(recs, nil)), now, w.s.margin)
	if err != nil {
		return nil, 0, err
	}
	tb, ok := ret.(*lua.LTable)
	if !ok || tb.Len() != 1+len(reqs) {
		return nil, 0, fmt.Errorf("async.lua returned %v, want %d numbers", ret, 1+len(reqs))
	}
	vs := make([]int64, tb.Len())
	for i := range vs {
		n, ok := tb.RawGetInt(i + 1).(lua.LNumber)
		if !ok {
			return nil, 0, fmt.Errorf("async.lua returned %v at %d, want a number", tb.RawGetInt(i+1), i)
		}
		vs[i] = int64(n) // Redis truncates a Lua number to an integer reply
	}
	counts := make([]int64, len(reqs))
	for i := range reqs {
		counts[i] = scaled(vs[1+i], scale[i])
	}
	return counts, vs[0], nil
}

// TestScriptSync runs async.lua's write-back of bucket limits in-process,
// interleaved with take.lua's Takes on the same keys, against the Go
// transitions: a write-back debits as sluice.Limit.Debit does (past the
// capacity too) and reports sluice.Limit.Level; every Take decides as
// sluice's transition on the state the write-backs left. Limits whose
// rate and period share a factor (the script keeps their level over it)
// and the script reading TIME or ARGV's clock.
func TestScriptSync(t *testing.T) {
	t.Parallel()
	limits := []sluice.Limit{
		{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second, Burst: 30},
		{Algorithm: sluice.TokenBucket, Rate: 7, Period: 3 * time.Second},
		{Algorithm: sluice.LeakyBucket, Rate: 1000, Period: time.Minute, Burst: 20},
		{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second, Burst: 5},
		{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Hour},
	}
	for i, l := range limits {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(t0)
			w := newTwin(t, clock, 10*time.Minute, i%2 == 0)
			sy := newSyncTwin(t, w, clock.Now)
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			b, _ := l.Bucket()
			keys := []string{"{a}", "{b}", "{c}"}
			states := make(map[string]*sluice.State)
			for _, k := range keys {
				states[k] = &sluice.State{}
			}
			debts := 0
			for step := range 3000 {
				clock.Advance(time.Duration(rng.Int64N(2*b.Hit/b.Drain+1)) * time.Microsecond)
				now := clock.Now().UnixMicro()
				k := keys[rng.IntN(len(keys))]
				st := states[k]
				if rng.IntN(3) > 0 {
					cost := rng.Int64N(4)
					want := l.TakeMicros(st, now, cost)
					got, err := sluice.Take(context.Background(), w, k, l, cost)
					if err != nil || got != want {
						t.Fatalf("step %d: Take(%s, %d) = %+v, %v; want %+v", step, k, cost, got, err, want)
					}
					continue
				}
				// A write-back of several keys in one call, one of them
				// perhaps twice.
				n := 1 + rng.IntN(3)
				reqs, windows := make([]sluice.Request, n), make([]int64, n)
				want := make([]int64, n)
				for j := range reqs {
					k := keys[rng.IntN(len(keys))]
					reqs[j] = sluice.Request{Key: k, Limit: l, Cost: rng.Int64N(2 * l.Capacity())}
					l.Debit(states[k], now, reqs[j].Cost)
					want[j] = l.Level(*states[k], now)
					if want[j] > b.Full {
						debts++
					}
				}
				got, at, err := sy.SyncCounts(reqs, windows)
				if err != nil {
					t.Fatalf("step %d: SyncCounts: %v", step, err)
				}
				if at != now || fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("step %d: SyncCounts(%+v) = %v at %d, want %v at %d", step, reqs, got, at, want, now)
				}
			}
			if debts == 0 {
				t.Fatal("no write-back left a debt: the test does not test debts")
			}
		})
	}
}
