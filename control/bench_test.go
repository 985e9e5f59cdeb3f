package control_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkSetOverride sets one override over a database that holds n:
// its cost must not grow with n.
func BenchmarkSetOverride(b *testing.B) {
	for _, n := range []int{10, 1500} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ctx := context.Background()
			db := openDB(b, testenv.RedisAddr(b))
			e := newEditor(b, db, func() time.Time { return t0 })
			if _, err := e.PutDomain(ctx, "a", "api", doc("api", 100), "", false); err != nil {
				b.Fatal(err)
			}
			ov := func(i int) rules.Override {
				return rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: fmt.Sprint("t", i)}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: int64(i + 1)}}}
			}
			for i := range n {
				if _, err := e.SetOverride(ctx, "a", ov(i), false); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := e.SetOverride(ctx, "a", ov(i%n), false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
