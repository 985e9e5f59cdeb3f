package admin

import "github.com/prometheus/client_golang/prometheus"

// CallsCounter returns the counter of calls by token and code in reg.
func CallsCounter(reg *prometheus.Registry, token, code string) prometheus.Collector {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "sluice_admin_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["token"] == token && labels["code"] == code {
				c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
				c.Add(m.GetCounter().GetValue())
				return c
			}
		}
	}
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
}

// Route is one route of a Handler: its pattern and whether it writes.
type Route struct {
	Pattern string
	Write   bool
}

// Routes returns h's routes.
func Routes(h *Handler) []Route {
	var out []Route
	for _, rt := range h.routes() {
		out = append(out, Route{rt.pattern, rt.write})
	}
	return out
}
