package metrics

import (
	"container/heap"
	"hash/maphash"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDetailedBytes is the default budget of the series named by
// request values (detailed_metric, value_to_metric): 4 MiB, about 2,000
// values, or 700 with Envoy's counters.
const DefaultDetailedBytes = 4 << 20

// DetailedShare is the part of a server's memory budget (--max-memory)
// that the series named by request values may hold, the rest going to
// the memory store: a 64th, at least 64 KiB and at most 16 MiB (4 MiB of
// the default 256 MiB).
func DetailedShare(maxMemory int64) int64 {
	return min(max(maxMemory/64, 64<<10), 16<<20)
}

// Bytes a value's series hold beside its name, measured on the heap by
// TestDetailedBound's calibration: sluice_decisions_total's three series
// (and the sketch's share), and Envoy's five counters when its labels are
// the value's own. A name is held about four times.
const (
	decisionSeriesBytes = 2048
	envoySeriesBytes    = 3584
	nameCopies          = 4
)

// The count-min sketch that counts the values not kept: cmsDepth rows of
// cmsWidth counters (32 KiB), halved, as are the kept values' counts,
// every cmsHalving values seen, so that what counts is recent traffic and
// a flood of distinct values does not fill the counters.
const (
	cmsDepth   = 4
	cmsWidth   = 2048
	cmsHalving = 8 * cmsWidth
)

// detailed bounds the names that carry request values: it keeps the
// series of the values seen most (space-saving: a value not kept takes
// the place of the kept one seen least once its count-min estimate passes
// that one's count) within a budget in bytes, and the rest are counted
// under their rule's name without values. A kept name's series are its
// own, made when it is kept and deleted when it is let go, never in
// Metrics' caches. It is safe for concurrent use.
type detailed struct {
	m      *Metrics
	mu     sync.Mutex
	max    int64 // the budget, bytes
	used   int64 // bytes of the kept values' series
	per    int64 // bytes of one value's series beside its name
	kept   map[string]*keptName
	order  keptHeap // the kept names, the one seen least first
	pinned map[string]bool
	cms    [cmsDepth][cmsWidth]uint32
	seen   int
	seed   maphash.Seed
}

// keptName is a name whose series are kept.
type keptName struct {
	name, domain string
	count        uint32 // seen, halved with the sketch
	cost         int64
	idx          int // in the heap
	c            [3]prometheus.Counter
	envoy        *envoySeries // nil without Envoy's counters
}

func newDetailed(m *Metrics) *detailed {
	return &detailed{m: m, max: DefaultDetailedBytes, per: decisionSeriesBytes, kept: map[string]*keptName{},
		pinned: map[string]bool{}, seed: maphash.MakeSeed()}
}

// budget returns the budget in bytes.
func (d *detailed) budget() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.max
}

// setBudget sets the budget in bytes and the bytes of a value's series
// beside its name, letting go of the names seen least while above it.
func (d *detailed) setBudget(budget, per int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.max, d.per = budget, per
	for d.used > d.max && len(d.order) > 0 {
		d.evict()
	}
}

// pin records name as one that a rule gives without request values: its
// decision series are never deleted, though a value's name may be the
// same.
func (d *detailed) pin(name string) {
	d.mu.Lock()
	d.pinned[name] = true
	d.mu.Unlock()
}

// keep counts one decision named name (with request values) in domain
// and returns its kept series, or nil: then the caller counts it under
// the name without values.
func (d *detailed) keep(domain string, name []byte) *keptName {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen++; d.seen >= cmsHalving {
		d.halve()
	}
	if k := d.kept[string(name)]; k != nil {
		k.count++
		heap.Fix(&d.order, k.idx)
		return k
	}
	est := d.add(name)
	cost := d.per + int64(len(name))*nameCopies
	if cost > d.max {
		return nil
	}
	for d.used+cost > d.max {
		if len(d.order) == 0 || d.order[0].count >= est {
			return nil
		}
		d.evict()
	}
	k := &keptName{name: string(name), domain: domain, count: est, cost: cost}
	for i, res := range [...]string{ResultOK, ResultOverLimit, ResultShadowOverLimit} {
		k.c[i] = d.m.decisions.WithLabelValues(domain, k.name, res)
	}
	if e := d.m.envoy.Load(); e != nil {
		k.envoy = e.hold(name)
	}
	d.kept[k.name] = k
	heap.Push(&d.order, k)
	d.used += cost
	return k
}

// evict deletes the series of the kept name seen least.
func (d *detailed) evict() {
	k := heap.Pop(&d.order).(*keptName)
	delete(d.kept, k.name)
	d.used -= k.cost
	if !d.pinned[k.name] {
		for _, res := range [...]string{ResultOK, ResultOverLimit, ResultShadowOverLimit} {
			d.m.decisions.DeleteLabelValues(k.domain, k.name, res)
		}
	}
	if k.envoy != nil {
		d.m.envoy.Load().release(k.envoy)
	}
}

// add counts name in the sketch (conservative update: only the least
// counters grow) and returns its estimate.
func (d *detailed) add(name []byte) uint32 {
	h := maphash.Bytes(d.seed, name)
	var idx [cmsDepth]int
	est := ^uint32(0)
	for i := range cmsDepth {
		idx[i] = int((h>>(16*i))^(h>>(16*i+7))) & (cmsWidth - 1)
		est = min(est, d.cms[i][idx[i]])
	}
	if est < ^uint32(0) {
		est++
	}
	for i := range cmsDepth {
		if d.cms[i][idx[i]] < est {
			d.cms[i][idx[i]] = est
		}
	}
	return est
}

// halve halves the sketch and the kept counts (which keeps the heap's
// order).
func (d *detailed) halve() {
	d.seen = 0
	for i := range d.cms {
		for j := range d.cms[i] {
			d.cms[i][j] >>= 1
		}
	}
	for _, k := range d.order {
		k.count >>= 1
	}
}

// keptHeap is a min-heap of kept names by count.
type keptHeap []*keptName

func (h keptHeap) Len() int           { return len(h) }
func (h keptHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h keptHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *keptHeap) Push(x any) {
	k := x.(*keptName)
	k.idx = len(*h)
	*h = append(*h, k)
}
func (h *keptHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return k
}
