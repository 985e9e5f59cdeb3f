package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// RulesSource counts the reloads of rules by their source and shows the
// rules in force: their version and generation, and their overrides. It
// is safe for concurrent use.
type RulesSource struct {
	reloads *prometheus.CounterVec
	info    *prometheus.GaugeVec
	gen     prometheus.Gauge
}

// NewRulesSource registers on reg sluice_rules_source_reloads_total
// {source, result}, sluice_rules_info{version} (1 for the version in
// force), sluice_rules_generation (the rules database's generation in
// force, 0 for files) and sluice_rules_overrides (the overrides in force
// in current's Set).
func NewRulesSource(reg prometheus.Registerer, current func() *rules.Set) (*RulesSource, error) {
	m := &RulesSource{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rules_source_reloads_total",
			Help: "Rules reloads by source (files; start, snapshot, notify, poll or expiry for a rules database) and result (success, failure).",
		}, []string{"source", "result"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_rules_info",
			Help: "1 for the version of the rules in force on this node.",
		}, []string{"version"}),
		gen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_rules_generation",
			Help: "The rules database's generation in force on this node (0 for rules files).",
		}),
	}
	overrides := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_rules_overrides",
		Help: "Overrides in force on this node.",
	}, func() float64 { return float64(current().NumOverrides()) })
	if err := registerAll(reg, "rules metrics", m.reloads, m.info, m.gen, overrides); err != nil {
		return nil, err
	}
	return m, nil
}

// Reload counts a reload from source: set is the new Set in force, or nil
// when err says why the Set in force stays; generation is the rules
// database's (0 for files).
func (m *RulesSource) Reload(set *rules.Set, source string, generation int64, err error) {
	if err != nil {
		m.reloads.WithLabelValues(source, "failure").Inc()
		return
	}
	m.reloads.WithLabelValues(source, "success").Inc()
	m.info.Reset()
	m.info.WithLabelValues(set.Version()).Set(1)
	m.gen.Set(float64(generation))
}
