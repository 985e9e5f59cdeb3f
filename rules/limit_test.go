package rules

import (
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestEnforced checks soft throttling's arithmetic on limits loaded from
// rules: rate and burst scaled by (100 + exceed_percent)/100, rounded down,
// and a soft limit that would admit nothing more refused.
func TestEnforced(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit string // the rate_limit mapping
		want  sluice.Limit
		err   string // a load error instead
	}{
		{"hard is the limit", "{unit: minute, requests_per_unit: 100}",
			sluice.Limit{Rate: 100, Period: time.Minute}, ""},
		{"hard ignores nothing", "{unit: minute, requests_per_unit: 100, throttling: hard}",
			sluice.Limit{Rate: 100, Period: time.Minute}, ""},
		{"soft 10%", "{unit: minute, requests_per_unit: 100, throttling: soft, exceed_percent: 10}",
			sluice.Limit{Rate: 110, Period: time.Minute}, ""},
		{"soft rounds down", "{unit: minute, requests_per_unit: 5, throttling: soft, exceed_percent: 50}",
			sluice.Limit{Rate: 7, Period: time.Minute}, ""},
		{"soft just above a whole hit", "{unit: second, requests_per_unit: 3, throttling: soft, exceed_percent: 34}",
			sluice.Limit{Rate: 4, Period: time.Second}, ""},
		{"soft 100% doubles", "{unit: hour, requests_per_unit: 7, throttling: soft, exceed_percent: 100}",
			sluice.Limit{Rate: 14, Period: time.Hour}, ""},
		{"soft scales the burst", "{unit: second, requests_per_unit: 30, algorithm: token_bucket, burst: 100, throttling: soft, exceed_percent: 10}",
			sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 33, Period: time.Second, Burst: 110}, ""},
		{"soft keeps the default burst", "{unit: second, requests_per_unit: 30, algorithm: gcra, throttling: soft, exceed_percent: 10}",
			sluice.Limit{Algorithm: sluice.GCRA, Rate: 33, Period: time.Second}, ""},
		{"soft burst grows though the rate rounds down", "{unit: second, requests_per_unit: 5, algorithm: leaky_bucket, burst: 100, throttling: soft, exceed_percent: 10}",
			sluice.Limit{Algorithm: sluice.LeakyBucket, Rate: 5, Period: time.Second, Burst: 110}, ""},
		{"soft that admits nothing more", "{unit: minute, requests_per_unit: 5, throttling: soft, exceed_percent: 10}",
			sluice.Limit{}, "rules.yaml:6: exceed_percent: 10% past 5/1m0s admits nothing more"},
		{"soft too large to compute", "{unit: second, requests_per_unit: 4000000000000, throttling: soft, exceed_percent: 1000000}",
			sluice.Limit{}, "rules.yaml:6: exceed_percent: 1000000% past 4000000000000/1s is too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse("rules.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: "+
				strings.ReplaceAll(tt.limit, ", ", "\n      , ")+"\n"))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Parse error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			l := s.Rules("api")[0].Limits[0]
			if got := l.Enforced(); got != tt.want {
				t.Errorf("Enforced() = %v, want %v", got, tt.want)
			}
			if err := l.Enforced().Validate(); err != nil {
				t.Errorf("Enforced() = %v does not validate: %v", l.Enforced(), err)
			}
		})
	}
}

// TestSoftLimitExact compares softLimit with exact arithmetic on values
// at the edges of int64, where a product overflows.
func TestSoftLimitExact(t *testing.T) {
	t.Parallel()
	values := []int64{1, 2, 99, 100, 101, 12345, 1 << 31, 1<<53 + 1, math.MaxInt64 / 101, math.MaxInt64/101 + 1,
		math.MaxInt64 / 1_000_100, math.MaxInt64/1_000_100 + 1, math.MaxInt64 / 2, math.MaxInt64}
	percents := []int64{0, 1, 10, 33, 99, 100, 101, 1_000_000}
	for _, v := range values {
		for _, pct := range percents {
			want := new(big.Int).Mul(big.NewInt(v), big.NewInt(100+pct))
			want.Quo(want, big.NewInt(100))
			if !want.IsInt64() {
				want.SetInt64(math.MaxInt64)
			}
			got := softLimit(sluice.Limit{Rate: v, Burst: v}, pct)
			if got.Rate != want.Int64() || got.Burst != want.Int64() {
				t.Errorf("softLimit(%d, %d%%) = rate %d burst %d, want %d", v, pct, got.Rate, got.Burst, want)
			}
		}
	}
	if got := softLimit(sluice.Limit{Rate: 10}, 50); got.Burst != 0 {
		t.Errorf("softLimit of a default burst = burst %d, want 0 (still the rate)", got.Burst)
	}
}
