package decide

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// latency sets the store timeout from the store's measured latency: the
// 99th percentile of its recent calls, times latencyFactor, at least min
// and at most max. Calls are counted in a histogram of buckets a quarter
// of a power of two wide (so the estimate is at most 25% high); every
// latencyEvery calls the estimate is taken again and the counts halved, so
// it follows the last few hundred calls. A call that timed out counts as
// one that took the timeout: when more than 1% do, the timeout grows by
// latencyFactor at the next estimate. It is safe for concurrent use; a
// call costs two atomic additions.
type latency struct {
	min, max int64 // µs
	buckets  [latencyBuckets]atomic.Int64
	n        atomic.Int64
	timeout  atomic.Int64 // µs
	mu       sync.Mutex   // held by the one who estimates
}

const (
	// latencyFactor is how far above the 99th percentile the timeout is:
	// a store whose tail doubles on a busy host stays under it.
	latencyFactor = 2
	// latencyEvery is how many calls go between two estimates.
	latencyEvery = 256
	// latencyBuckets covers latencies up to 2^35 µs (9.5 hours).
	latencyBuckets = 16 + 4*32
)

// newLatency returns a latency whose timeout starts at lo and stays
// within lo and hi.
func newLatency(lo, hi time.Duration) *latency {
	l := &latency{min: lo.Microseconds(), max: max(hi, lo).Microseconds()}
	l.timeout.Store(l.min)
	return l
}

// bucket returns the bucket of a latency of us µs.
func bucket(us int64) int {
	if us < 16 {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - 1 // 4 and up
	m := int(us>>(e-2)) & 3
	return min(16+(e-4)*4+m, latencyBuckets-1)
}

// upper returns the most µs a latency of bucket i took.
func upper(i int) int64 {
	if i < 16 {
		return int64(i)
	}
	e, m := (i-16)/4+4, int64((i-16)%4)
	return (4+m+1)<<(e-2) - 1
}

// now returns the store timeout in force.
func (l *latency) now() time.Duration {
	return time.Duration(l.timeout.Load()) * time.Microsecond
}

// observe counts a store call that took d.
func (l *latency) observe(d time.Duration) {
	l.buckets[bucket(d.Microseconds())].Add(1)
	if l.n.Add(1)%latencyEvery == 0 && l.mu.TryLock() {
		l.estimate()
		l.mu.Unlock()
	}
}

// estimate sets the timeout from the counts and halves them. l.mu is
// held.
func (l *latency) estimate() {
	var counts [latencyBuckets]int64
	var total int64
	for i := range l.buckets {
		counts[i] = l.buckets[i].Load()
		total += counts[i]
		l.buckets[i].Add(-counts[i] / 2)
	}
	if total == 0 {
		return
	}
	rank, seen := total-total/100, int64(0) // the 99th percentile's
	for i, c := range counts {
		if seen += c; seen >= rank {
			l.timeout.Store(min(max(upper(i)*latencyFactor, l.min), l.max))
			return
		}
	}
}
