package metrics

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
)

// DefaultNearLimitRatio is the share of a limit past which Envoy's
// ratelimit counts hits as near_limit: its NEAR_LIMIT_RATIO default.
const DefaultNearLimitRatio = 0.8

// envoyStats exports Envoy ratelimit's per-descriptor counters under the
// names that its statsd_exporter mapping (and its own Prometheus sink)
// gives them, so that dashboards built on Envoy's ratelimit keep working:
// ratelimit_service_rate_limit_{total_hits,within_limit,near_limit,
// over_limit,shadow_mode} with the labels domain, key1 and key2, the
// first three dot-separated parts of Envoy's stat name of the descriptor
// (a descriptor of one level has no key2, as in Envoy's sink), and
// ratelimit_service_config_load_{success,error}. The counters count hits,
// as Envoy's do: a descriptor with hits_addend 5 adds 5.
type envoyStats struct {
	ratio                   float64
	total, within, near     *prometheus.CounterVec
	over, shadow            *prometheus.CounterVec
	loadSuccess, loadFailed prometheus.Counter

	mu      sync.RWMutex
	series  map[string]*envoySeries // by Envoy stat name
	retired []*envoySeries          // dropped from series since the last FlushEnvoy, at most maxCached
	// The series of the names with request values that Metrics keeps
	// (hold, release), how many such names each label set has, and the
	// label sets of names without values, whose series are never deleted.
	valued  map[*envoySeries]bool
	held    map[[3]string]int
	fixed   map[[3]string]bool
	flushed bool             // FlushEnvoy was called: retired series are kept for it
	loads   [2]atomic.Uint64 // config_load_success, config_load_error
	sent    [2]uint64        // loads as last flushed (FlushEnvoy's)
}

// envoySeries are the counters of one stat name.
type envoySeries struct {
	total, within, near, over, shadow prometheus.Counter

	labels [3]string // domain, key1, key2
	// name is Envoy's stat name, sanitized; n counts the hits of each of
	// envoyCounters, all of them, and sent them as last flushed
	// (FlushEnvoy's): statsd gets the differences.
	name string
	n    [numEnvoyCounters]atomic.Uint64
	sent [numEnvoyCounters]uint64
}

// envoyCounters are the names of Envoy's per-descriptor counters, in the
// order of envoySeries.n.
var envoyCounters = [...]string{"total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"}

const numEnvoyCounters = len(envoyCounters)

// EnvoyStats registers Envoy ratelimit's counters on reg and counts every
// decision from now on in them too, with nearLimitRatio as Envoy's
// NEAR_LIMIT_RATIO (0 means DefaultNearLimitRatio). Call it once, before
// decisions are made.
func (m *Metrics) EnvoyStats(reg prometheus.Registerer, nearLimitRatio float64) error {
	if nearLimitRatio == 0 {
		nearLimitRatio = DefaultNearLimitRatio
	}
	if nearLimitRatio < 0 || nearLimitRatio > 1 || math.IsNaN(nearLimitRatio) {
		return fmt.Errorf("near limit ratio %v: want a number between 0 and 1", nearLimitRatio)
	}
	labels := []string{"domain", "key1", "key2"}
	helps := map[string]string{}
	vec := func(name, help string) *prometheus.CounterVec {
		helps[name] = help + " (Envoy ratelimit's name; domain, key1 and key2 are the first parts of its stat name of the descriptor)."
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: helps[name]}, labels)
	}
	e := &envoyStats{
		ratio:  nearLimitRatio,
		total:  vec("total_hits", "Hits of descriptors that have a limit"),
		within: vec("within_limit", "Hits within the limit"),
		near:   vec("near_limit", "Hits past the near-limit ratio of the limit, within it or the first over it"),
		over:   vec("over_limit", "Hits over the limit, shadow mode included"),
		shadow: vec("shadow_mode", "Hits over a limit in shadow mode, which were allowed"),
		loadSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_success",
			Help: "Rules loads and reloads that succeeded (Envoy ratelimit's name).",
		}),
		loadFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_error",
			Help: "Rules loads and reloads that failed (Envoy ratelimit's name).",
		}),
		series: make(map[string]*envoySeries),
		valued: map[*envoySeries]bool{},
		held:   map[[3]string]int{},
		fixed:  map[[3]string]bool{},
	}
	cs := []prometheus.Collector{e.loadSuccess, e.loadFailed}
	for name, v := range map[string]*prometheus.CounterVec{"total_hits": e.total, "within_limit": e.within,
		"near_limit": e.near, "over_limit": e.over, "shadow_mode": e.shadow} {
		cs = append(cs, newOneLevel(v, "ratelimit_service_rate_limit_"+name, helps[name]))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register Envoy metrics: %w", err)
		}
	}
	m.envoy.Store(e)
	m.detailed.setBudget(m.detailed.budget(), decisionSeriesBytes+envoySeriesBytes)
	return nil
}

// reload counts a rules load that failed when failed is true.
func (e *envoyStats) reload(failed bool) {
	if failed {
		e.loadFailed.Inc()
		e.loads[1].Add(1)
		return
	}
	e.loadSuccess.Inc()
	e.loads[0].Add(1)
}

// observe counts the hits of one descriptor whose Envoy stat name is key
// and whose verdict is st, as Envoy's ratelimit counts them. A descriptor
// without a limit (no rule, or unlimited) is not counted, as in Envoy.
func (e *envoyStats) observe(key []byte, st *decide.Status, hits int64) {
	if st.Limit == nil || hits <= 0 {
		return
	}
	e.count(e.get(key), st, hits)
}

// count counts hits of a descriptor whose series are s and verdict st.
func (e *envoyStats) count(s *envoySeries, st *decide.Status, hits int64) {
	if st.Limit == nil || hits <= 0 {
		return
	}
	h := float64(hits)
	s.total.Add(h)
	s.n[0].Add(uint64(hits))
	within, near, over := envoyCounts(st.Decision.Limit, st.Decision.Remaining, hits,
		st.Code == decide.OverLimit || st.ShadowOverLimit, e.ratio)
	if within > 0 {
		s.within.Add(float64(within))
		s.n[1].Add(uint64(within))
	}
	if near > 0 {
		s.near.Add(float64(near))
		s.n[2].Add(uint64(near))
	}
	if over > 0 {
		s.over.Add(float64(over))
		s.n[3].Add(uint64(over))
		if st.ShadowOverLimit {
			s.shadow.Add(float64(over))
			s.n[4].Add(uint64(over))
		}
	}
}

// FlushEnvoy calls send with each of Envoy ratelimit's counters that
// counted since the last call, by Envoy's statsd name
// (ratelimit.service.rate_limit.DOMAIN.KEY_VALUE….total_hits,
// ratelimit.service.config_load_success…), and what it counted since.
// It does nothing unless EnvoyStats was called. Calls must not overlap;
// decisions may go on meanwhile (what they count goes to the next call).
func (m *Metrics) FlushEnvoy(send func(name string, delta uint64)) {
	e := m.envoy.Load()
	if e == nil {
		return
	}
	e.mu.Lock()
	e.flushed = true
	all := make([]*envoySeries, 0, len(e.series)+len(e.valued)+len(e.retired))
	for _, s := range e.series {
		all = append(all, s)
	}
	for s := range e.valued {
		all = append(all, s)
	}
	all = append(all, e.retired...)
	e.retired = nil
	e.mu.Unlock()
	for _, s := range all {
		for i := range s.n {
			if n := s.n[i].Load(); n != s.sent[i] {
				send("ratelimit.service.rate_limit."+s.name+"."+envoyCounters[i], n-s.sent[i])
				s.sent[i] = n
			}
		}
	}
	for i, name := range [...]string{"config_load_success", "config_load_error"} {
		if n := e.loads[i].Load(); n != e.sent[i] {
			send("ratelimit.service."+name, n-e.sent[i])
			e.sent[i] = n
		}
	}
}

// EnvoyTotals calls visit with each of Envoy ratelimit's counters that
// counted since the server started, by Envoy's statsd name (as
// FlushEnvoy), and its total, sorted by name: what Envoy's debug port
// shows at /stats. The counters of series dropped for the memory bound
// are left out. It does nothing unless EnvoyStats was called, and leaves
// FlushEnvoy's counts alone.
func (m *Metrics) EnvoyTotals(visit func(name string, total uint64)) {
	e := m.envoy.Load()
	if e == nil {
		return
	}
	type total struct {
		name string
		n    uint64
	}
	var all []total
	e.mu.Lock()
	add := func(s *envoySeries) {
		for i := range s.n {
			if n := s.n[i].Load(); n > 0 {
				all = append(all, total{"ratelimit.service.rate_limit." + s.name + "." + envoyCounters[i], n})
			}
		}
	}
	for _, s := range e.series {
		add(s)
	}
	for s := range e.valued {
		add(s)
	}
	e.mu.Unlock()
	for i, name := range [...]string{"config_load_success", "config_load_error"} {
		all = append(all, total{"ratelimit.service." + name, e.loads[i].Load()})
	}
	slices.SortFunc(all, func(a, b total) int { return strings.Compare(a.name, b.name) })
	for _, t := range all {
		visit(t.name, t.n)
	}
}

// envoyCounts splits the hits of one descriptor into Envoy's within_limit,
// near_limit and over_limit, from the limit, what remains after the
// decision and whether it was over the limit. Envoy's arithmetic, on the
// count before and after the hits: over the limit, the hits past it are
// over_limit (all of them when the count was already past it) and those
// between the near-limit threshold and the limit are near_limit; within
// it, all are within_limit and those past the threshold near_limit too.
// sluice takes nothing for a denied request, so there the count after is
// what it would have been.
func envoyCounts(limit, remaining, hits int64, overLimit bool, ratio float64) (within, near, over int64) {
	threshold := int64(math.Floor(float64(limit) * ratio))
	used := max(limit-remaining, 0)
	if overLimit {
		before, after := used, used+hits
		if before >= limit {
			return 0, 0, hits
		}
		return 0, limit - max(threshold, before), after - limit
	}
	after := used
	before := after - hits
	if after > threshold {
		if before >= threshold {
			near = hits
		} else {
			near = after - threshold
		}
	}
	return hits, near, 0
}

// newSeries returns the counters of the stat name key.
func (e *envoyStats) newSeries(key []byte) *envoySeries {
	domain, key1, key2 := envoyLabels(key)
	return &envoySeries{
		labels: [3]string{domain, key1, key2},
		name:   envoySanitize(key),
		total:  e.total.WithLabelValues(domain, key1, key2),
		within: e.within.WithLabelValues(domain, key1, key2),
		near:   e.near.WithLabelValues(domain, key1, key2),
		over:   e.over.WithLabelValues(domain, key1, key2),
		shadow: e.shadow.WithLabelValues(domain, key1, key2),
	}
}

// hold returns the counters of the stat name key, which holds request
// values, until release.
func (e *envoyStats) hold(key []byte) *envoySeries {
	s := e.newSeries(key)
	e.mu.Lock()
	e.valued[s] = true
	e.held[s.labels]++
	e.mu.Unlock()
	return s
}

// release lets s go: its labels' series are deleted when no other name
// holds them and no name without values has them; what it counted since
// the last flush is flushed next.
func (e *envoyStats) release(s *envoySeries) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.valued, s)
	if e.flushed && len(e.retired) < maxCached {
		e.retired = append(e.retired, s)
	}
	if e.held[s.labels]--; e.held[s.labels] > 0 {
		return
	}
	delete(e.held, s.labels)
	if !e.fixed[s.labels] {
		for _, v := range []*prometheus.CounterVec{e.total, e.within, e.near, e.over, e.shadow} {
			v.DeleteLabelValues(s.labels[:]...)
		}
	}
}

// get returns the counters of the stat name key, which holds no request
// values, creating them on first use; past maxCached names the cache
// starts over (the counters stay).
func (e *envoyStats) get(key []byte) *envoySeries {
	e.mu.RLock()
	s := e.series[string(key)]
	e.mu.RUnlock()
	if s != nil {
		return s
	}
	s = e.newSeries(key)
	e.mu.Lock()
	e.fixed[s.labels] = true
	if len(e.series) >= maxCached {
		// What they counted since the last flush is flushed next (up
		// to maxCached series; past that, lost to statsd).
		for _, old := range e.series {
			if !e.flushed || len(e.retired) >= maxCached {
				break
			}
			e.retired = append(e.retired, old)
		}
		clear(e.series)
	}
	e.series[string(key)] = s
	e.mu.Unlock()
	return s
}

// envoyLabels returns the domain, key1 and key2 labels of an Envoy stat
// name: its first three dot-separated parts after Envoy's sanitizing (':'
// and '|' become '_'), as the statsd_exporter mapping captures them.
func envoyLabels(key []byte) (domain, key1, key2 string) {
	parts := bytes.SplitN(key, []byte("."), 4)
	label := func(i int) string {
		if i >= len(parts) {
			return ""
		}
		return envoySanitize(parts[i])
	}
	return label(0), label(1), label(2)
}

// envoySanitize returns an Envoy stat name as Envoy's stats library sends
// it: ':' and '|', which statsd's format reserves, become '_' (and so does
// a line break, which would end a statsd line).
func envoySanitize(name []byte) string {
	return string(bytes.Map(func(r rune) rune {
		if r == ':' || r == '|' || r == '\n' || r == '\r' {
			return '_'
		}
		return r
	}, name))
}
