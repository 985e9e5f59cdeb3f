package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// oneLevel exports an Envoy per-descriptor CounterVec (labels domain,
// key1, key2) as Envoy ratelimit's Prometheus sink writes it: a
// descriptor of one level has the labels domain and key1 alone, not an
// empty key2. It is an unchecked collector (Describe sends nothing), so
// that one family holds both label sets, as Envoy's does.
type oneLevel struct {
	vec  *prometheus.CounterVec
	desc *prometheus.Desc // of the series without key2
}

var _ prometheus.Collector = oneLevel{}

func newOneLevel(vec *prometheus.CounterVec, name, help string) oneLevel {
	return oneLevel{vec: vec, desc: prometheus.NewDesc(name, help, []string{"domain", "key1"}, nil)}
}

// Describe sends nothing: the collector is unchecked.
func (o oneLevel) Describe(chan<- *prometheus.Desc) {}

// Collect sends the vector's series, those whose key2 is empty without it.
func (o oneLevel) Collect(ch chan<- prometheus.Metric) {
	in := make(chan prometheus.Metric)
	go func() {
		o.vec.Collect(in)
		close(in)
	}()
	for m := range in {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		var domain, key1, key2 string
		for _, l := range pb.GetLabel() {
			switch l.GetName() {
			case "domain":
				domain = l.GetValue()
			case "key1":
				key1 = l.GetValue()
			case "key2":
				key2 = l.GetValue()
			}
		}
		if key2 != "" {
			ch <- m
			continue
		}
		c, err := prometheus.NewConstMetric(o.desc, prometheus.CounterValue, pb.GetCounter().GetValue(), domain, key1)
		if err == nil {
			ch <- c
		}
	}
}
