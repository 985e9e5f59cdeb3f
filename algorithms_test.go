package sluice_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

type step struct {
	at   time.Duration // since t0
	cost int64
	want sluice.Decision
}

func TestAlgorithmEdges(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	never := sluice.Never
	tests := []struct {
		name  string
		limit sluice.Limit
		steps []step
	}{
		{"fixed window: fills, denies until the boundary, resets", sluice.Limit{Rate: 3, Period: time.Second}, []step{
			{0, 2, sluice.Decision{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: time.Second}},
			{250 * ms, 1, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 750 * ms}},
			{999 * ms, 1, sluice.Decision{Limit: 3, Remaining: 0, ResetAfter: ms, RetryAfter: ms}},
			{time.Second, 1, sluice.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: time.Second}},
		}},
		{"fixed window: cost 0 reports without counting", sluice.Limit{Rate: 3, Period: time.Second}, []step{
			{0, 0, sluice.Decision{Allowed: true, Limit: 3, Remaining: 3}},
			{0, 3, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: time.Second}},
			{10 * ms, 0, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 990 * ms}},
		}},
		{"fixed window: cost above the limit never passes and takes nothing", sluice.Limit{Rate: 3, Period: time.Second}, []step{
			{0, 4, sluice.Decision{Limit: 3, Remaining: 3, RetryAfter: never}},
			{0, 3, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: time.Second}},
		}},
		{"fixed window: a clock going back stays in the known window", sluice.Limit{Rate: 2, Period: time.Second}, []step{
			{1500 * ms, 2, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 500 * ms}},
			{900 * ms, 1, sluice.Decision{Limit: 2, Remaining: 0, ResetAfter: 1100 * ms, RetryAfter: 1100 * ms}},
		}},
		{"sliding window: the worked example of the issue", sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute}, []step{
			{0, 88, sluice.Decision{Allowed: true, Limit: 100, Remaining: 12, ResetAfter: 2 * time.Minute}},
			{time.Minute, 12, sluice.Decision{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 2 * time.Minute}},
			// 15 s in: 88 × 45/60 + 12 = 78, so 22 remain.
			{time.Minute + 15*time.Second, 1, sluice.Decision{Allowed: true, Limit: 100, Remaining: 21, ResetAfter: 105 * time.Second}},
		}},
		{"sliding window: retry when the previous window has decayed enough", sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Second}, []step{
			{0, 10, sluice.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 2 * time.Second}},
			// At 1s the previous 10 weigh 10: wait until they weigh 9, at 1.1s.
			{time.Second, 1, sluice.Decision{Limit: 10, Remaining: 0, ResetAfter: time.Second, RetryAfter: 100 * ms}},
			{1100 * ms, 1, sluice.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 1900 * ms}},
		}},
		{"sliding log: exact, frees each hit one period after it", sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 2, Period: time.Second}, []step{
			{0, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second}},
			{300 * ms, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: time.Second}},
			{999 * ms, 1, sluice.Decision{Limit: 2, Remaining: 0, ResetAfter: 301 * ms, RetryAfter: ms}},
			{time.Second, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: time.Second}},
		}},
		{"token bucket: 30/s with burst 100 bursts to 100, then 30/s", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100}, []step{
			{0, 100, sluice.Decision{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 3333334 * time.Microsecond}},
			{0, 1, sluice.Decision{Limit: 100, Remaining: 0, ResetAfter: 3333334 * time.Microsecond, RetryAfter: 33334 * time.Microsecond}},
			{time.Second, 30, sluice.Decision{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 3333334 * time.Microsecond}},
			{time.Second, 1, sluice.Decision{Limit: 100, Remaining: 0, ResetAfter: 3333334 * time.Microsecond, RetryAfter: 33334 * time.Microsecond}},
		}},
		{"token bucket: cost above the burst never passes", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second, Burst: 5}, []step{
			{0, 6, sluice.Decision{Limit: 5, Remaining: 5, RetryAfter: never}},
		}},
		{"leaky bucket: admitted requests wait their turn", sluice.Limit{Algorithm: sluice.LeakyBucket, Rate: 10, Period: time.Second, Burst: 3}, []step{
			{0, 1, sluice.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 100 * ms}},
			{0, 1, sluice.Decision{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 200 * ms, Wait: 100 * ms}},
			{0, 1, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 300 * ms, Wait: 200 * ms}},
			{0, 1, sluice.Decision{Limit: 3, Remaining: 0, ResetAfter: 300 * ms, RetryAfter: 100 * ms}},
			{50 * ms, 1, sluice.Decision{Limit: 3, Remaining: 0, ResetAfter: 250 * ms, RetryAfter: 50 * ms}},
		}},
		{"gcra: burst then one per emission interval", sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second, Burst: 2}, []step{
			{0, 2, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 200 * ms}},
			{50 * ms, 1, sluice.Decision{Limit: 2, Remaining: 0, ResetAfter: 150 * ms, RetryAfter: 50 * ms}},
			{100 * ms, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 200 * ms}},
		}},
		{"gcra: a rate that does not divide the period still bursts exactly", sluice.Limit{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second}, []step{
			{0, 3, sluice.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 1000002 * time.Microsecond}},
			{0, 1, sluice.Decision{Limit: 3, Remaining: 0, ResetAfter: 1000002 * time.Microsecond, RetryAfter: 333334 * time.Microsecond}},
		}},
		{"gcra: a clock going back counts as the latest admission", sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second, Burst: 2}, []step{
			{time.Second, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 100 * ms}},
			{500 * ms, 1, sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 200 * ms}},
			{300 * ms, 1, sluice.Decision{Limit: 2, Remaining: 0, ResetAfter: 200 * ms, RetryAfter: 100 * ms}},
		}},
		{"negative cost is denied", sluice.Limit{Rate: 3, Period: time.Second}, []step{
			{0, -1, sluice.Decision{Limit: 3, RetryAfter: never}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.limit.Validate(); err != nil {
				t.Fatal(err)
			}
			var s sluice.State
			for i, st := range tt.steps {
				if got := tt.limit.Take(&s, t0.Add(st.at), st.cost); got != st.want {
					t.Fatalf("step %d (+%v, cost %d):\n got %+v\nwant %+v", i, st.at, st.cost, got, st.want)
				}
			}
		})
	}
}

func TestInvalidLimitNeverPanics(t *testing.T) {
	t.Parallel()
	for _, l := range []sluice.Limit{
		{},
		{Rate: -1, Period: time.Second},
		{Rate: 1, Period: -time.Second},
		{Rate: 1, Period: 500 * time.Nanosecond},
		{Algorithm: 200, Rate: 1, Period: time.Second},
		{Algorithm: sluice.GCRA, Rate: 1, Period: time.Second, Burst: -3},
	} {
		var s sluice.State
		d := l.Take(&s, t0, 1)
		if d.Allowed || d.RetryAfter != sluice.Never {
			t.Errorf("%+v: %+v, want denied with Never", l, d)
		}
	}
}

func TestCloneSharesNothing(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Second}
	var s sluice.State
	l.Take(&s, t0, 2)
	c := s.Clone()
	if d := l.Take(&c, t0, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the clone decided %+v, want the last hit allowed", d)
	}
	if d := l.Take(&s, t0, 0); d.Remaining != 1 {
		t.Fatalf("the original has %d remaining after its clone took a hit, want 1", d.Remaining)
	}
}
