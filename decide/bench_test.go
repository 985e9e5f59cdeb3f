package decide_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

const benchRules = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: token_bucket, burst: 2000000}
    descriptors:
      - key: api
        value: messages.send
        rate_limits:
          - {unit: second, requests_per_unit: 1000000}
          - {unit: minute, unit_multiplier: 5, requests_per_unit: 100000000, algorithm: sliding_window}
`

// blocking hides a store's decide.NonBlocking, as a store that waits on
// I/O (Redis) has none: the store timeout is armed for each call.
type blocking struct{ sluice.Store }

// nonBlocking declares a store decide.NonBlocking.
type nonBlocking struct{ sluice.Store }

func (nonBlocking) NonBlocking() bool { return true }

// BenchmarkDecide decides requests of 10,000 users on the memory store
// (with its coarse clock, as the server runs it): one descriptor with one
// limit, and three descriptors with four limits in one TakeAll; as the
// memory store (NonBlocking), and as a store that blocks (Redis), whose
// calls the fail mode local makes in a goroutine each, under the store
// timeout.
func BenchmarkDecide(b *testing.B) {
	set := loadRules(b, benchRules)
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	const users = 10000
	one := make([]*decide.Request, users)
	three := make([]*decide.Request, users)
	for i := range users {
		u := "user-" + strconv.Itoa(i)
		ip := "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
		one[i] = req("api", []string{"user", u})
		three[i] = req("api", []string{"remote_address", ip}, []string{"user", u}, []string{"user", u, "api", "messages.send"})
	}
	for _, bc := range []struct {
		name  string
		store sluice.Store
		reqs  []*decide.Request
	}{
		{name: "descriptors=1/timeout=50ms", store: mem, reqs: one},
		{name: "descriptors=3/timeout=50ms", store: mem, reqs: three},
		{name: "descriptors=1/blocking", store: blocking{mem}, reqs: one},
		{name: "descriptors=3/blocking", store: blocking{mem}, reqs: three},
		{name: "descriptors=1/nonblocking", store: nonBlocking{mem}, reqs: one},
		{name: "descriptors=3/nonblocking", store: nonBlocking{mem}, reqs: three},
	} {
		cfg := decide.DefaultConfig()
		cfg.Rules = func() *rules.Set { return set }
		cfg.Store = bc.store
		s, err := decide.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := s.Decide(ctx, bc.reqs[i%users])
				if err != nil || resp.Overall != decide.OK {
					b.Fatalf("Decide = %+v, %v", resp, err)
				}
				i++
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				i := 0
				for pb.Next() {
					resp, err := s.Decide(ctx, bc.reqs[i%users])
					if err != nil || resp.Overall != decide.OK {
						b.Errorf("Decide = %+v, %v", resp, err)
						return
					}
					i += 7
				}
			})
		})
	}
}
