package decide_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkDecideRequestLimit decides one descriptor of 10,000 users on
// the memory store as the rules limit it, and with its own limit (Envoy's
// RateLimitDescriptor.limit) of the rules' unit: what a request's own
// limit adds to a decision (rules.RequestRule's rule, limit and ID).
func BenchmarkDecideRequestLimit(b *testing.B) {
	set := loadRules(b, benchRules)
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	cfg := decide.DefaultConfig()
	cfg.Rules = func() *rules.Set { return set }
	cfg.Store = nonBlocking{mem}
	s, err := decide.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const users = 10000
	for _, own := range []bool{false, true} {
		reqs := make([]*decide.Request, users)
		for i := range users {
			reqs[i] = req("api", []string{"remote_address", "10.1." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)})
			if own {
				reqs[i].Descriptors[0].Limit = &rules.RequestLimit{RequestsPerUnit: 1000000, Unit: "second"}
			}
		}
		b.Run("own="+strconv.FormatBool(own), func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := s.Decide(ctx, reqs[i%users])
				if err != nil || resp.Overall != decide.OK || resp.Statuses[0].Limit == nil {
					b.Fatalf("Decide = %+v, %v", resp, err)
				}
				i++
			}
		})
	}
}
