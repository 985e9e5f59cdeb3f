package main

import (
	"context"

	"github.com/peterbourgon/ff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
)

// compatFlags are the flags that give Envoy ratelimit's behaviour where it
// differs from sluice's: its metric names and its global shadow mode. Its
// environment (envoyenv.go) sets them.
type compatFlags struct {
	envoyMetrics   bool
	nearLimitRatio float64
	shadow         bool
	envoyKeys      bool   // --envoy-redis-keys: share Envoy ratelimit's Redis counters
	envoyKeyPrefix string // --envoy-key-prefix: Envoy's CACHE_KEY_PREFIX
	statsd         statsdFlags
}

func (c *compatFlags) register(fs *ff.FlagSet) {
	fs.BoolVarDefault(&c.envoyMetrics, 0, "envoy-metrics", false, withEnv("envoy-metrics",
		"also count Envoy ratelimit's per-descriptor metrics under its names (ratelimit_service_rate_limit_total_hits...)"))
	fs.Float64Var(&c.nearLimitRatio, 0, "near-limit-ratio", metrics.DefaultNearLimitRatio, withEnv("near-limit-ratio",
		"share of a limit past which --envoy-metrics counts hits as near_limit"))
	fs.BoolVarDefault(&c.shadow, 0, "shadow", false, withEnv("shadow",
		"every limit in shadow mode: decided and counted, never enforced (Envoy's SHADOW_MODE)"))
	fs.BoolVarDefault(&c.envoyKeys, 0, "envoy-redis-keys", false, withEnv("envoy-redis-keys",
		"count fixed windows in Redis under Envoy ratelimit's keys and as it counts (INCRBY, EXPIRE), sharing its counters (a Redis --store only)"))
	fs.StringVar(&c.envoyKeyPrefix, 0, "envoy-key-prefix", "", withEnv("envoy-key-prefix",
		"with --envoy-redis-keys, the prefix of Envoy's keys (Envoy's CACHE_KEY_PREFIX)"))
	c.statsd.register(fs)
}

// metrics registers Envoy's metrics on m and reg when asked: call it
// before the rules load, which they count.
func (c compatFlags) metrics(m *metrics.Metrics, reg prometheus.Registerer) error {
	if err := c.statsd.check(c.envoyMetrics); err != nil {
		return err
	}
	if !c.envoyMetrics {
		return nil
	}
	if err := m.EnvoyStats(reg, c.nearLimitRatio); err != nil {
		return usageError("--near-limit-ratio: %v", err)
	}
	return nil
}

// decorate returns svc as the compat flags want it.
func (c compatFlags) decorate(svc metrics.Service) metrics.Service {
	if c.shadow {
		return shadowAll{svc}
	}
	return svc
}

// shadowAll puts every limit in shadow mode, as Envoy's SHADOW_MODE does:
// a descriptor over its limit is answered OK and reported as a shadow
// over-limit (so metrics count it), and so is the request.
type shadowAll struct{ next metrics.Service }

// Decide implements metrics.Service.
func (s shadowAll) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	resp, err := s.next.Decide(ctx, r)
	if err != nil || resp.Overall != decide.OverLimit {
		return resp, err
	}
	resp.Overall = decide.OK
	for i := range resp.Statuses {
		if st := &resp.Statuses[i]; st.Code == decide.OverLimit {
			st.Code, st.Shadow, st.ShadowOverLimit = decide.OK, true, true
		}
	}
	return resp, nil
}

// Mode passes on the decorated service's Mode, for readiness and metrics.
func (s shadowAll) Mode() decide.Mode {
	if m, ok := s.next.(interface{ Mode() decide.Mode }); ok {
		return m.Mode()
	}
	return decide.ModeStore
}
