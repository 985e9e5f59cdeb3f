package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/shed"
)

// Shed registers on reg the state of a load shedder (package shed), read
// once per scrape from stats:
//
//	sluice_shed_limit                      the adaptive concurrency limit
//	sluice_shed_in_flight                  requests at the upstream
//	sluice_shed_waiting                    requests waiting for a slot
//	sluice_shed_min_rtt_seconds            the upstream's least latency
//	sluice_shed_admitted_total{priority}   requests let through
//	sluice_shed_shed_total{priority}       requests shed (503)
//	sluice_shed_upstream_failures_total    5xx and failed upstream requests
func Shed(reg prometheus.Registerer, stats func() shed.Stats) error {
	if err := reg.Register(&shedCollector{stats: stats}); err != nil {
		return fmt.Errorf("register shed metrics: %w", err)
	}
	return nil
}

var (
	shedLimit    = prometheus.NewDesc("sluice_shed_limit", "The load shedder's adaptive limit on requests in flight to the upstream.", nil, nil)
	shedInFlight = prometheus.NewDesc("sluice_shed_in_flight", "Requests at the upstream now.", nil, nil)
	shedWaiting  = prometheus.NewDesc("sluice_shed_waiting", "Requests waiting for a slot at the upstream now.", nil, nil)
	shedMinRTT   = prometheus.NewDesc("sluice_shed_min_rtt_seconds", "The upstream's least latency, its latency without queueing.", nil, nil)
	shedAdmitted = prometheus.NewDesc("sluice_shed_admitted_total", "Requests the load shedder let through, by priority.", []string{"priority"}, nil)
	shedShed     = prometheus.NewDesc("sluice_shed_shed_total", "Requests the load shedder shed with 503, by priority.", []string{"priority"}, nil)
	shedFailures = prometheus.NewDesc("sluice_shed_upstream_failures_total", "Requests the upstream failed (5xx or no answer).", nil, nil)
)

type shedCollector struct{ stats func() shed.Stats }

func (c *shedCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{shedLimit, shedInFlight, shedWaiting, shedMinRTT, shedAdmitted, shedShed, shedFailures} {
		ch <- d
	}
}

func (c *shedCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(shedLimit, prometheus.GaugeValue, float64(s.Limit))
	ch <- prometheus.MustNewConstMetric(shedInFlight, prometheus.GaugeValue, float64(s.InFlight))
	ch <- prometheus.MustNewConstMetric(shedWaiting, prometheus.GaugeValue, float64(s.Waiting))
	ch <- prometheus.MustNewConstMetric(shedMinRTT, prometheus.GaugeValue, s.MinRTT.Seconds())
	for p := shed.Sheddable; p <= shed.Critical; p++ {
		ch <- prometheus.MustNewConstMetric(shedAdmitted, prometheus.CounterValue, float64(s.Admitted[p]), p.String())
		ch <- prometheus.MustNewConstMetric(shedShed, prometheus.CounterValue, float64(s.Shed[p]), p.String())
	}
	ch <- prometheus.MustNewConstMetric(shedFailures, prometheus.CounterValue, float64(s.Failed))
}
