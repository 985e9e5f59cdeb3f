package decide_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkDecideOverrides decides one descriptor of 10,000 users on the
// memory store with no overrides and beside 10,000 (one for each of
// those users, set with rules.Set.WithOverrides as a rules database
// does), for the users the overrides are for (users=listed: each decision
// finds its override) and for others (users=other). Compare the
// overrides=0 and overrides=10000 columns with
//
//	go test ./decide -run XXX -bench DecideOverrides -count 10 > o.txt
//	benchstat -col /overrides o.txt
func BenchmarkDecideOverrides(b *testing.B) {
	base, with, listed, other := overrideSets(b)
	for _, sc := range []struct {
		name string
		set  *rules.Set
	}{{"overrides=0", base}, {"overrides=10000", with}} {
		s := overrideService(b, sc.set)
		for _, rc := range []struct {
			name string
			reqs []*decide.Request
		}{{"users=listed", listed}, {"users=other", other}} {
			b.Run(sc.name+"/"+rc.name, func(b *testing.B) {
				ctx := context.Background()
				for _, r := range rc.reqs { // every key made before the timing
					if _, err := s.Decide(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					resp, err := s.Decide(ctx, rc.reqs[i%len(rc.reqs)])
					if err != nil || resp.Overall != decide.OK {
						b.Fatalf("Decide = %+v, %v", resp, err)
					}
					i++
				}
			})
		}
	}
}

// BenchmarkDecideOverridesPaired decides each request on two services, one
// without overrides and one beside 10,000, in alternating order, timing
// each decision, so that the load of a shared machine falls on both alike.
// It reports each one's mean ns per decision and their ratio
// (with/without, 1.05 would be 5% more), and the same of their medians,
// which a burst of load on the machine (a preempted decision takes
// milliseconds) does not move:
//
//	go test ./decide -run XXX -bench DecideOverridesPaired -benchtime 200000x -count 10
func BenchmarkDecideOverridesPaired(b *testing.B) {
	base, with, listed, other := overrideSets(b)
	s0, s1 := overrideService(b, base), overrideService(b, with)
	for _, rc := range []struct {
		name string
		reqs []*decide.Request
	}{{"users=listed", listed}, {"users=other", other}} {
		b.Run(rc.name, func(b *testing.B) {
			ctx := context.Background()
			for _, r := range rc.reqs {
				if _, err := s0.Decide(ctx, r); err != nil {
					b.Fatal(err)
				}
				if _, err := s1.Decide(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			var d0, d1 time.Duration
			var h0, h1 histogram
			i := 0
			for b.Loop() {
				r := rc.reqs[i%len(rc.reqs)]
				first, second, df, ds, hf, hs := s0, s1, &d0, &d1, &h0, &h1
				if i%2 == 1 {
					first, second, df, ds, hf, hs = s1, s0, &d1, &d0, &h1, &h0
				}
				t0 := time.Now()
				r1, err1 := first.Decide(ctx, r)
				t1 := time.Now()
				r2, err2 := second.Decide(ctx, r)
				t2 := time.Now()
				if err1 != nil || err2 != nil || r1.Overall != decide.OK || r2.Overall != decide.OK {
					b.Fatalf("Decide: %v %v", err1, err2)
				}
				*df += t1.Sub(t0)
				*ds += t2.Sub(t1)
				hf.add(t1.Sub(t0))
				hs.add(t2.Sub(t1))
				i++
			}
			b.ReportMetric(float64(d0.Nanoseconds())/float64(i), "ns/decide-0")
			b.ReportMetric(float64(d1.Nanoseconds())/float64(i), "ns/decide-10000")
			b.ReportMetric(float64(d1)/float64(d0), "ratio")
			m0, m1 := h0.median(), h1.median()
			b.ReportMetric(m0, "p50-ns/decide-0")
			b.ReportMetric(m1, "p50-ns/decide-10000")
			b.ReportMetric(m1/m0, "p50-ratio")
		})
	}
}

// histogram counts durations in buckets of histWidth up to 16 µs, and
// those beyond in its last, without allocating.
type histogram [4096]uint32

// histWidth is the width of a histogram's bucket.
const histWidth = 4 * time.Nanosecond

func (h *histogram) add(d time.Duration) {
	h[min(int(d/histWidth), len(h)-1)]++
}

// median returns the middle of the durations added, in ns, to the
// middle of its bucket.
func (h *histogram) median() float64 {
	var n, seen uint64
	for _, c := range h {
		n += uint64(c)
	}
	for i, c := range h {
		if seen += uint64(c); seen*2 >= n {
			return (float64(i) + 0.5) * float64(histWidth)
		}
	}
	return 0
}

// overrideSets returns the benchmark rules without and with an override
// for each of 10,000 users, and requests of those users and of others.
func overrideSets(b *testing.B) (base, with *rules.Set, listed, other []*decide.Request) {
	base = loadRules(b, benchRules)
	const users = 10000
	now := time.Now()
	ovs := make([]rules.Override, users)
	listed = make([]*decide.Request, users)
	other = make([]*decide.Request, users)
	for i := range users {
		u := "user-" + strconv.Itoa(i)
		ovs[i] = rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "user", Value: u}},
			Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 1000000, Algorithm: "token_bucket", Burst: 2000000}}}
		listed[i] = req("api", []string{"user", u})
		other[i] = req("api", []string{"user", "other-" + strconv.Itoa(i)})
	}
	with, err := base.WithOverrides(now, ovs...)
	if err != nil {
		b.Fatal(err)
	}
	if n := len(with.Overrides()); n != users {
		b.Fatalf("%d overrides in force", n)
	}
	return base, with, listed, other
}

// overrideService returns a decision service of set on a memory store of
// its own, closed when the benchmark ends.
func overrideService(b *testing.B, set *rules.Set) *decide.Service {
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mem.Close() })
	cfg := decide.DefaultConfig()
	cfg.Rules = func() *rules.Set { return set }
	cfg.Store = nonBlocking{mem}
	s, err := decide.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
