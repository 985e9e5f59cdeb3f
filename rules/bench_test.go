package rules_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkDecideOverrides measures a decision with the real decide and
// memory store under rules with no override and with 10,000 (one per
// tenant but the ones asked about), so that the cost overrides add to a
// decision shows: compare with benchstat -col /overrides.
func BenchmarkDecideOverrides(b *testing.B) {
	base, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	ovs := make([]rules.Override, 10_000)
	for i := range ovs {
		ovs[i] = rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: fmt.Sprint("t", i)}},
			Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}}
	}
	with, err := base.WithOverrides(time.Time{}, ovs...)
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name string
		set  *rules.Set
	}{{"overrides=0", base}, {"overrides=10000", with}} {
		b.Run(bb.name, func(b *testing.B) {
			st, err := memory.New(memory.DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			dc := decide.DefaultConfig()
			dc.Rules = func() *rules.Set { return bb.set }
			dc.Store = st
			dc.Logger = slog.New(slog.DiscardHandler)
			svc, err := decide.New(dc)
			if err != nil {
				b.Fatal(err)
			}
			req := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{
				{Entries: []decide.Entry{{Key: "tenant", Value: "acme"}}, Cost: 1},
				{Entries: []decide.Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "alice"}}, Cost: 1},
			}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if resp, err := svc.Decide(ctx, req); err != nil || resp.Overall != decide.OK {
					b.Fatal(resp, err)
				}
			}
		})
	}
}
