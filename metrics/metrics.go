// Package metrics exports sluice's Prometheus metrics: decisions by domain,
// descriptor and result, the store's latency and errors, decisions made by
// a fail mode, the mode in force, and rules reloads. The collectors are
// registered on a registry the caller passes in, never the global one.
// Metrics watches without wrapping: it is a decide.Observer of the
// decision service (Observe, WatchMode) and a store/stack Watcher of the
// store (StartCall, EndCall).
package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
)

// Results, as the result label of sluice_decisions_total writes them.
const (
	ResultOK              = "ok"
	ResultOverLimit       = "over_limit"
	ResultShadowOverLimit = "shadow_over_limit"
)

// maxCached bounds the per-descriptor counters Metrics keeps at hand; past
// it the cache starts over (the counters stay registered).
const maxCached = 10000

// Metrics holds sluice's collectors. It is safe for concurrent use.
type Metrics struct {
	decisions     *prometheus.CounterVec
	unknownDomain prometheus.Counter
	invalid       prometheus.Counter
	failDecisions *prometheus.CounterVec
	failByMode    [decide.MaxMode + 1]prometheus.Counter
	storeDuration *prometheus.HistogramVec
	takeAll       prometheus.Observer // storeDuration's take_all
	storeErrors   *prometheus.CounterVec
	timeouts      prometheus.Counter
	cancels       prometheus.Counter
	ooms          prometheus.Counter
	errs          prometheus.Counter
	reloads       *prometheus.CounterVec
	reloadOK      prometheus.Gauge
	mode          *modeCollector
	envoy         atomic.Pointer[envoyStats] // nil unless EnvoyStats was called

	mu       sync.RWMutex
	series   map[string]*[3]prometheus.Counter // by metric key without request values: ok, over_limit, shadow_over_limit
	bufs     sync.Pool                         // *[]byte
	detailed *detailed                         // the series of metric keys with request values
}

// New returns Metrics whose collectors are registered on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Descriptors decided, by domain, descriptor (Envoy's stat name of the matched rule, with the request's values only for detailed_metric and value_to_metric; empty when no rule matched) and result (ok, over_limit, shadow_over_limit).",
		}, []string{"domain", "descriptor", "result"}),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_unknown_domain_requests_total",
			Help: "Requests for a domain no rules define, answered OK with no limit.",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_invalid_requests_total",
			Help: "Requests rejected as invalid: no domain, no descriptors, an entry without a key.",
		}),
		failDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_fail_mode_decisions_total",
			Help: "Requests the store did not decide, by mode: fail_open, fail_closed or local because the store failed or the circuit breaker kept it away; slow (denied) or local because it did not answer within the store timeout.",
		}, []string{"mode"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_duration_seconds",
			Help:    "Latency of store calls, failed ones included, by operation (take, take_all).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store calls that failed, by reason (timeout, canceled, oom: the store is full, Redis at maxmemory refusing writes; error).",
		}, []string{"reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rules_reloads_total",
			Help: "Rules loads and reloads, by result (success, failure). A failed reload keeps the rules in force.",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_rules_last_reload_successful",
			Help: "Whether the last rules load or reload succeeded (1) or failed (0).",
		}),
		mode:   newModeCollector(),
		series: make(map[string]*[3]prometheus.Counter),
	}
	m.bufs.New = func() any { b := make([]byte, 0, 128); return &b }
	m.detailed = newDetailed(m)
	if err := registerAll(reg, "metrics", m.decisions, m.unknownDomain, m.invalid, m.failDecisions,
		m.storeDuration, m.storeErrors, m.reloads, m.reloadOK, m.mode); err != nil {
		return nil, err
	}
	for mo := decide.ModeOpen; mo <= decide.MaxMode; mo++ {
		m.failByMode[mo] = m.failDecisions.WithLabelValues(mo.String())
	}
	m.storeDuration.WithLabelValues("take") // the op of a single Take: none since TakeAll, exported as 0
	m.takeAll = m.storeDuration.WithLabelValues("take_all")
	m.timeouts = m.storeErrors.WithLabelValues(reasonTimeout)
	m.errs = m.storeErrors.WithLabelValues(reasonError)
	m.cancels = m.storeErrors.WithLabelValues(reasonCanceled)
	m.ooms = m.storeErrors.WithLabelValues(reasonOOM)
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m, nil
}

// SetDetailedBytes bounds the series named by request values
// (detailed_metric, value_to_metric: one per value a client sends) to
// about n bytes (zero means DefaultDetailedBytes): the values seen most
// keep theirs, the others are counted under their rule's name without
// values (as if neither were set). Call it before decisions are made.
func (m *Metrics) SetDetailedBytes(n int64) {
	if n <= 0 {
		n = DefaultDetailedBytes
	}
	per := int64(decisionSeriesBytes)
	if m.envoy.Load() != nil {
		per += envoySeriesBytes
	}
	m.detailed.setBudget(n, per)
}

// Reload records a load or reload of the rules that failed with err, or
// succeeded when err is nil. The server calls it after each attempt.
func (m *Metrics) Reload(err error) {
	if e := m.envoy.Load(); e != nil {
		e.reload(err != nil)
	}
	if err != nil {
		m.reloads.WithLabelValues("failure").Inc()
		m.reloadOK.Set(0)
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.reloadOK.Set(1)
}

// observe counts the statuses of a decided request.
func (m *Metrics) observe(r *decide.Request, resp *decide.Response) {
	if resp.UnknownDomain {
		m.unknownDomain.Inc()
		return
	}
	if resp.Mode != decide.ModeStore && resp.Mode <= decide.MaxMode {
		m.failByMode[resp.Mode].Inc()
	}
	envoy := m.envoy.Load()
	bp := m.bufs.Get().(*[]byte)
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		res := 0
		switch {
		case st.Code == decide.OverLimit:
			res = 1
		case st.ShadowOverLimit:
			res = 2
		}
		if i >= len(r.Descriptors) {
			break
		}
		b := (*bp)[:0]
		entries := r.Descriptors[i].Entries
		switch {
		case st.Rule == nil:
			b = append(b, 0) // no rule: one series per domain
			b = append(b, r.Domain...)
		case st.Rule.MetricValues():
			// Named by the request's values: kept within the budget, or
			// counted under the rule's name.
			b = st.Rule.AppendMetricKey(b, entries)
			if k := m.detailed.keep(r.Domain, b); k != nil {
				*bp = b
				k.c[res].Inc()
				if envoy != nil && k.envoy != nil {
					envoy.count(k.envoy, st, r.Descriptors[i].Cost)
				}
				continue
			}
			b = st.Rule.AppendMetricName(b[:0], entries)
		default:
			b = st.Rule.AppendMetricKey(b, entries)
		}
		*bp = b
		m.counters(b, r.Domain, st.Rule != nil)[res].Inc()
		if envoy != nil && st.Rule != nil {
			envoy.observe(b, st, r.Descriptors[i].Cost)
		}
	}
	m.bufs.Put(bp)
}

// counters returns the counters of the descriptor whose metric key
// without request values is key (or, without a rule, of the domain),
// creating them on first use.
func (m *Metrics) counters(key []byte, domain string, matched bool) *[3]prometheus.Counter {
	m.mu.RLock()
	c := m.series[string(key)]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	desc := ""
	if matched {
		desc = string(key)
		m.detailed.pin(desc)
	}
	c = &[3]prometheus.Counter{
		m.decisions.WithLabelValues(domain, desc, ResultOK),
		m.decisions.WithLabelValues(domain, desc, ResultOverLimit),
		m.decisions.WithLabelValues(domain, desc, ResultShadowOverLimit),
	}
	m.mu.Lock()
	if len(m.series) >= maxCached {
		clear(m.series)
	}
	m.series[string(key)] = c
	m.mu.Unlock()
	return c
}

// modeCollector exports sluice_mode: 1 for the mode in force, 0 for the
// others, read from the decision service at scrape time.
type modeCollector struct {
	desc *prometheus.Desc
	src  atomic.Pointer[func() decide.Mode]
}

func newModeCollector() *modeCollector {
	return &modeCollector{desc: prometheus.NewDesc("sluice_mode",
		"Where decisions come from: 1 for the mode in force (store, fail_open, fail_closed, local, slow), 0 for the others.",
		[]string{"mode"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *modeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *modeCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.src.Load()
	if f == nil {
		return
	}
	cur := (*f)()
	for mo := decide.ModeStore; mo <= decide.MaxMode; mo++ {
		v := 0.0
		if mo == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, mo.String())
	}
}
