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
	base := loadRules(b, benchRules)
	const users = 10000
	now := time.Now()
	ovs := make([]rules.Override, users)
	listed := make([]*decide.Request, users)
	other := make([]*decide.Request, users)
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
	for _, sc := range []struct {
		name string
		set  *rules.Set
	}{{"overrides=0", base}, {"overrides=10000", with}} {
		mem, err := memory.New(memory.DefaultConfig())
		if err != nil {
			b.Fatal(err)
		}
		defer mem.Close()
		cfg := decide.DefaultConfig()
		set := sc.set
		cfg.Rules = func() *rules.Set { return set }
		cfg.Store = nonBlocking{mem}
		s, err := decide.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, rc := range []struct {
			name string
			reqs []*decide.Request
		}{{"users=listed", listed}, {"users=other", other}} {
			b.Run(sc.name+"/"+rc.name, func(b *testing.B) {
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					resp, err := s.Decide(ctx, rc.reqs[i%users])
					if err != nil || resp.Overall != decide.OK {
						b.Fatalf("Decide = %+v, %v", resp, err)
					}
					i++
				}
			})
		}
	}
}
