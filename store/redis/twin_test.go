package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// twin is the Redis store with take.lua run in-process (scriptVM) instead
// of in Redis: the Store's own request encoding, grouping of calls into
// one script call (group.add, repeats), split of the output, replays and
// checks, around the script. It decides as a Store outside a cluster.
type twin struct {
	s  *Store // its configuration and limit encodings only: no client
	vm *scriptVM
}

var _ sluice.Store = (*twin)(nil)

// newTwin returns a twin whose clock, for the script's now and for
// expiry, is clock, and whose keys live margin past their reset. With
// useTIME the script reads the clock with Redis's TIME, else from
// ARGV[1], as with Config.Now.
func newTwin(t testing.TB, clock *fakeClock, margin time.Duration, useTIME bool) *twin {
	cfg := testConfig(clock.Now)
	cfg.ExpiryMargin = margin
	if useTIME {
		cfg.Now = nil
	}
	return &twin{
		s:  &Store{cfg: cfg, margin: strconv.FormatInt(margin.Milliseconds(), 10)},
		vm: newScriptVM(t, takeScript, clock.Now),
	}
}

// exec runs calls as one script call, as Store.exec runs a batch's calls
// on one slot, and hands each its part of the output.
func (w *twin) exec(calls ...*call) error {
	g := group{takes: -1}
	for _, c := range calls {
		g.add(c)
	}
	now, err := w.s.now()
	if err != nil {
		return err
	}
	out, err := w.vm.eval(g.keys, now, w.s.margin, string(g.blob), flag(repeats(g.keys, nil)))
	if err != nil {
		return err
	}
	return split(g.calls, out)
}

// take is Store.take, in-process: TakeAll of one request of key in group.
func (w *twin) take(ctx context.Context, key, group string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if d, ok := local(l, cost); ok {
		return d, nil
	}
	c := &call{n: 1}
	if err := w.s.prepare(c, ctx, w.s.name(key, group), l, cost); err != nil {
		return sluice.Decision{}, err
	}
	if err := w.exec(c); err != nil {
		return sluice.Decision{}, err
	}
	return c.decision(l, cost)
}

// TakeAll is Store.TakeAll outside a cluster, in-process.
func (w *twin) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(reqs) == 1 {
		var err error
		ds[0], err = w.take(ctx, reqs[0].Key, reqs[0].Group, reqs[0].Limit, reqs[0].Cost)
		return err
	}
	mode, remote := locals(reqs, ds)
	if len(remote) == 0 {
		return nil
	}
	return w.group(ctx, reqs, remote, mode, ds)
}

// group decides reqs[i], i in idx, as one TakeAll group in mode.
func (w *twin) group(ctx context.Context, reqs []sluice.Request, idx []int, mode byte, ds []sluice.Decision) error {
	c, err := w.s.groupCall(ctx, reqs, w.s.names(reqs, idx), idx, mode)
	if err != nil {
		return err
	}
	if err := w.exec(c); err != nil {
		return err
	}
	_, err = c.decisions(reqs, idx, ds)
	return err
}

// dryFirst is a store whose every Take is first decided as a dry run
// (TakeAll's mode 2, which the script decides itself with step or its
// sliding log, checked against Go's replay), which must agree with the
// Take's decision (Go's replay of the state the Take found, or the
// script's own for a sliding_log).
type dryFirst struct{ *twin }

func (w dryFirst) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(reqs) != 1 {
		return w.twin.TakeAll(ctx, reqs, ds)
	}
	if _, ok := local(reqs[0].Limit, reqs[0].Cost); ok {
		return w.twin.TakeAll(ctx, reqs, ds)
	}
	var dry [1]sluice.Decision
	if err := w.group(ctx, reqs, []int{0}, modeDryRun, dry[:]); err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	err := w.twin.TakeAll(ctx, reqs, ds)
	if err == nil && dry[0] != ds[0] {
		return fmt.Errorf("dry run decided %+v, the Take %+v", dry[0], ds[0])
	}
	return err
}

// TestScriptTake is TestReferenceTake on take.lua in-process: every
// algorithm under random times (some going back) and costs, each Take
// first decided as a dry run, keys expiring a period after their reset
// (no less than the clock steps back, so that an expired key is as good
// as new whenever it is asked again).
func TestScriptTake(t *testing.T) {
	t.Parallel()
	for i, l := range referenceLimits() {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(t0)
			w := newTwin(t, clock, l.Period, i%2 == 0)
			testTake(t, dryFirst{w}, clock, i, l)
			if n := w.vm.db.scripts; n == 0 {
				t.Fatal("the script never ran")
			}
		})
	}
}

// TestScriptHeavy is TestReferenceHeavy on take.lua in-process, with keys
// that expire at their reset time (no margin): a key forgotten too early
// would decide differently.
func TestScriptHeavy(t *testing.T) {
	t.Parallel()
	for i, l := range heavyLimits() {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(t0)
			testHeavy(t, dryFirst{newTwin(t, clock, 0, false)}, clock, i, l)
		})
	}
}

// TestScriptTakeAll is TestReferenceTakeAll on take.lua in-process, every
// TakeAll's decisions checked against Go's replay by the store itself
// (call.decisions) and against the model by the test; the script reads
// the clock with TIME in one run, from ARGV in the other.
func TestScriptTakeAll(t *testing.T) {
	t.Parallel()
	for _, tagged := range []bool{true, false} {
		t.Run(fmt.Sprintf("hash tag %v", tagged), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(t0)
			testTakeAll(t, newTwin(t, clock, time.Second, tagged), clock, tagged)
		})
	}
}

// fuzzBytes reads a fuzzer's input a byte at a time, 0 once it is used up.
type fuzzBytes []byte

func (b *fuzzBytes) next() int {
	if len(*b) == 0 {
		return 0
	}
	v := (*b)[0]
	*b = (*b)[1:]
	return int(v)
}

// fuzzModel is the Go side of FuzzScript: a State per key, under the
// algorithm that wrote it last (another algorithm's request starts it
// afresh, as the script does).
type fuzzModel map[string]*fuzzState

type fuzzState struct {
	alg  sluice.Algorithm
	subs int64 // a sliding_window's sub-windows: another count starts afresh too
	s    sluice.State
}

// state returns the state r decides on in states (a TakeAll's working
// copies, or the model itself), made from the model's when missing.
func (m fuzzModel) state(states fuzzModel, r sluice.Request) *fuzzState {
	st := states[r.Key]
	fresh := fuzzState{alg: r.Limit.Algorithm, subs: r.Limit.SubWindows()}
	if st == nil {
		st = &fresh
		if committed := m[r.Key]; committed != nil && committed.alg == st.alg && committed.subs == st.subs {
			st.s = committed.s.Clone()
		}
		states[r.Key] = st
	} else if st.alg != fresh.alg || st.subs != fresh.subs {
		*st = fresh
	}
	return st
}

// takeAll decides reqs at now as Store.TakeAll must: in order, on working
// copies, kept only if all are allowed and write is set. With take, reqs
// is one Take, whose state is kept allowed or not.
func (m fuzzModel) takeAll(reqs []sluice.Request, now int64, write, take bool) []sluice.Decision {
	ds := make([]sluice.Decision, len(reqs))
	work := fuzzModel{}
	all := true
	for i, r := range reqs {
		if r.Cost < 0 { // denied whatever the state, which it leaves alone
			ds[i] = r.Limit.TakeMicros(new(sluice.State), now, r.Cost)
		} else {
			ds[i] = r.Limit.TakeMicros(&m.state(work, r).s, now, r.Cost)
		}
		all = all && ds[i].Allowed
	}
	if take || write && all {
		for k, st := range work {
			m[k] = st
		}
	}
	return ds
}

// FuzzScript runs batches of Takes, TakeAlls and dry runs that the fuzzer
// makes, each batch as one script call (as Store.exec sends one), on
// take.lua in-process, and checks every decision against fuzzModel: one
// limit per algorithm, six keys each mostly asked under an algorithm of
// its own, sometimes under another, time going forward, and no expiry
// margin, so that a key forgotten before it is as good as new shows;
// batches of up to six calls, on one to six keys, so that a key asked
// twice in a call sees what the first request wrote.
// The store's own checks (the replays of Takes and TakeAlls, checkLog)
// must pass too.
func FuzzScript(f *testing.F) {
	f.Add([]byte{3, 5, 7, 1, 2, 3, 40, 0, 1, 2, 1, 2, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5})
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10, 3, 0, 0, 2, 0, 2, 6, 2, 2, 1, 1, 1, 3})
	f.Add([]byte("\x05\x03\x02\x07\x01\x04\x06\x02\x05\x00\x03\x01\xfa\x03\x02\x04\x80\x06\x85\x02\x03\x03\x01\x01\x02"))
	f.Add([]byte("take all, take, dry run, and a key asked under two algorithms \xff\x81\x92\xa3\xb4"))
	f.Fuzz(func(t *testing.T, data []byte) {
		runScriptBatches(t, fuzzBytes(data))
	})
}

// TestScriptBatches runs FuzzScript's body on 300 random inputs, in which
// keys must expire.
func TestScriptBatches(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(11, 12))
	expired := 0
	for range 300 {
		data := make([]byte, 40+r.IntN(200))
		for i := range data {
			data[i] = byte(r.IntN(256))
		}
		if !t.Run("", func(t *testing.T) { expired += runScriptBatches(t, data) }) {
			t.Fatalf("input %q", data)
		}
	}
	if expired == 0 {
		t.Error("no key expired: the batches do not test the TTLs")
	}
	t.Logf("%d keys expired", expired)
}

// runScriptBatches is FuzzScript's body. It returns how many keys
// expired.
func runScriptBatches(t *testing.T, in fuzzBytes) int {
	clock := clocktest.New(t0)
	w := newTwin(t, clock, 0, true)
	algs := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog,
		sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA, sluice.SlidingWindow}
	limits := make([]sluice.Limit, len(algs))
	for i, alg := range algs {
		l := sluice.Limit{Algorithm: alg, Rate: int64(1 + in.next()%6),
			Period: time.Duration(1+in.next()%8)*125*time.Millisecond + time.Duration(in.next())*time.Microsecond}
		if alg.HasBurst() {
			l.Burst = int64(in.next() % 9) // 0: none
		}
		if i == 6 { // a sliding_window of 2 to 6 sub-windows, on the same keys as the others
			l.Precision = int64(2 + in.next()%5)
			l.Period -= l.Period % (time.Duration(l.Precision) * time.Microsecond)
		}
		limits[i] = l
	}
	// request reads a request: one of 1-6 keys, mostly under the key's
	// own algorithm, and its cost, from -1 to 6.
	keys, salt := 1+in.next()%6, in.next()
	request := func() sluice.Request {
		k := in.next()
		alg := (k%keys + salt) % len(limits)
		if k&0x80 != 0 {
			alg = (k >> 3) % len(limits)
		}
		return sluice.Request{Key: fmt.Sprintf("f%d", k%keys), Limit: limits[alg], Cost: int64(in.next()%8) - 1}
	}
	ctx := context.Background()
	m := fuzzModel{}
	now := t0
	for batch := 0; batch < 40 && len(in) > 0; batch++ {
		if adv := in.next(); adv >= 250 {
			now = now.Add(time.Duration(adv-249) * 2 * time.Second)
		} else {
			now = now.Add(time.Duration(adv) * 4099 * time.Microsecond)
		}
		clock.Set(now)
		type op struct {
			reqs  []sluice.Request
			take  bool // else a TakeAll or its dry run
			write bool
			c     *call // nil for requests decided without the script
			got   []sluice.Decision
		}
		var ops []*op
		var calls []*call
		for range 1 + in.next()%6 {
			o := &op{write: true}
			switch kind := in.next() % 4; kind {
			case 0, 1: // a Take
				o.reqs, o.take = []sluice.Request{request()}, true
				o.got = make([]sluice.Decision, 1)
				r := o.reqs[0]
				if d, ok := local(r.Limit, r.Cost); ok {
					o.got[0] = d
					break
				}
				o.c = &call{n: 1}
				if err := w.s.prepare(o.c, ctx, w.s.name(r.Key, ""), r.Limit, r.Cost); err != nil {
					t.Fatal(err)
				}
			default: // a TakeAll of 2-4 requests, or a dry run of it
				for range 2 + in.next()%3 {
					o.reqs = append(o.reqs, request())
				}
				o.got = make([]sluice.Decision, len(o.reqs))
				mode, remote := locals(o.reqs, o.got)
				if kind == 3 {
					mode = modeDryRun
				}
				o.write = mode == modeAll
				if len(remote) == 0 {
					break
				}
				var err error
				if o.c, err = w.s.groupCall(ctx, o.reqs, w.s.names(o.reqs, remote), remote, mode); err != nil {
					t.Fatal(err)
				}
			}
			ops = append(ops, o)
			if o.c != nil {
				calls = append(calls, o.c)
			}
		}
		if len(calls) > 0 {
			if err := w.exec(calls...); err != nil {
				t.Fatalf("batch %d: %v", batch, err)
			}
		}
		for i, o := range ops {
			if o.c != nil && o.take {
				var err error
				if o.got[0], err = o.c.decision(o.reqs[0].Limit, o.reqs[0].Cost); err != nil {
					t.Fatalf("batch %d, op %d: %v", batch, i, err)
				}
			} else if o.c != nil {
				_, remote := locals(o.reqs, make([]sluice.Decision, len(o.reqs)))
				if _, err := o.c.decisions(o.reqs, remote, o.got); err != nil {
					t.Fatalf("batch %d, op %d: %v", batch, i, err)
				}
			}
			want := m.takeAll(o.reqs, now.UnixMicro(), o.write, o.take)
			t.Logf("batch %d at %v, op %d (take %v, write %v): %v: %+v", batch, now.Sub(t0), i, o.take, o.write, o.reqs, o.got)
			for k := range want {
				if o.got[k] != want[k] {
					t.Fatalf("batch %d at %v, op %d (%v, write %v), request %d:\n got %+v\nwant %+v",
						batch, now.Sub(t0), i, o.reqs, o.write, k, o.got[k], want[k])
				}
			}
		}
	}
	return w.vm.db.expired
}

// TestScriptChecked runs the store on copies of take.lua with one defect
// each, such as a change to the script might bring, and checks that the
// store's own checks refuse the decision that shows it: Go's replay of a
// Take (the allowed bit) and of a TakeAll (the whole decision), and the
// sliding_log's checkLog.
func TestScriptChecked(t *testing.T) {
	t.Parallel()
	fixed := sluice.Limit{Rate: 3, Period: time.Second}
	gcra := sluice.Limit{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second}
	log := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second}
	tests := []struct {
		name, old, new string
		reqs           []sluice.Request
	}{
		{"take's allowed bit, inlined gcra",
			"if nxt - at <= b then", "if nxt - at < b then",
			[]sluice.Request{{Key: "a", Limit: gcra, Cost: 3}}},
		{"take all's remaining",
			"remaining = a - n\n", "remaining = a - n - 1\n",
			[]sluice.Request{{Key: "a", Limit: fixed, Cost: 1}, {Key: "b", Limit: fixed, Cost: 1}}},
		{"take all's reset, written state",
			"if ws ~= t then t, n = ws, 0 end", "if ws ~= t then t, n = ws, 1 end",
			[]sluice.Request{{Key: "a", Limit: fixed, Cost: 1}, {Key: "b", Limit: fixed, Cost: 1}}},
		{"sliding_log's reset",
			"if last then reset = last + period - now end", "if last then reset = last + period - now - 1 end",
			[]sluice.Request{{Key: "a", Limit: log, Cost: 1}}},
		{"sliding_log's retry",
			"retry = passesLog(L, rate - cost) + period - now", "retry = passesLog(L, rate - cost) + 2 * period - now",
			[]sluice.Request{{Key: "a", Limit: log, Cost: 3}, {Key: "b", Limit: log, Cost: 1}}},
		{"sliding_log in a take all",
			"return allowed, max(rate - L.sum, 0),", "return allowed, max(rate - L.sum, 1),",
			[]sluice.Request{{Key: "a", Limit: log, Cost: 3}, {Key: "b", Limit: fixed, Cost: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := strings.Replace(takeScript, tt.old, tt.new, 1)
			if src == takeScript {
				t.Fatalf("take.lua has no %q", tt.old)
			}
			clock := clocktest.New(t0)
			w := newTwin(t, clock, time.Second, false)
			w.vm = newScriptVM(t, src, clock.Now)
			ctx := context.Background()
			ds := make([]sluice.Decision, len(tt.reqs))
			var err error
			for step := 0; step < 5 && err == nil; step++ {
				clock.Set(t0.Add(time.Duration(step) * 100 * time.Millisecond))
				if len(tt.reqs) == 1 {
					_, err = sluice.Take(ctx, w, tt.reqs[0].Key, tt.reqs[0].Limit, tt.reqs[0].Cost)
				} else {
					err = w.TakeAll(ctx, tt.reqs, ds)
				}
			}
			if err == nil {
				t.Fatal("five steps on a defective script, no error")
			}
			t.Log(err)
		})
	}
}
