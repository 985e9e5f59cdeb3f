package loadgen

import (
	"context"
	"testing"
	"time"
)

// TestPacedLatencyFromDue paces one caller at 1,000 calls a second
// against a server that takes at least 5 ms an answer: the caller falls
// behind, and each call's latency runs from its due instant, not from
// when it was sent, so the latencies grow with the backlog (the k-th call
// is due at k ms and sent at 5k ms or later) instead of staying at 5 ms.
func TestPacedLatencyFromDue(t *testing.T) {
	slow := func(ctx context.Context, u int) (answer, error) {
		time.Sleep(5 * time.Millisecond)
		return answer{}, nil
	}
	c := DefaultConfig()
	c.Concurrency, c.Rate, c.Duration = 1, 1000, 50*time.Millisecond
	r := load(context.Background(), c, slow)
	if r.OK < 2 {
		t.Fatalf("%d calls, want a few", r.OK)
	}
	// the last call, k = OK − 1, is due at k ms and sent at 5k ms or later
	k := time.Duration(r.OK - 1)
	if got, want := r.Percentile(1), 4*k*time.Millisecond; got < want {
		t.Fatalf("%d calls, the slowest %v: want at least %v, its wait behind the others", r.OK, got, want)
	}
}
