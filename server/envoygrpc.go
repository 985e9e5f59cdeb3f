package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// rlsServicePrefix starts the full method names of Envoy's rate limit
// service, whose calls envoyGRPCStats counts.
const rlsServicePrefix = "/envoy.service.ratelimit.v3.RateLimitService/"

// envoyGRPCStats counts the gRPC calls of the rate limit service under
// the names Envoy ratelimit's Prometheus sink (its default mapping) gives
// its server's stats: ratelimit_service_total_requests{grpc_method} and
// ratelimit_service_response_time_seconds{grpc_method}, a histogram with
// the Prometheus client's default buckets, as the statsd exporter's. It
// watches the calls as a grpc stats.Handler: it changes none.
type envoyGRPCStats struct {
	total   *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

var _ stats.Handler = (*envoyGRPCStats)(nil)

// newEnvoyGRPCStats registers the series on reg.
func newEnvoyGRPCStats(reg prometheus.Registerer) (*envoyGRPCStats, error) {
	s := &envoyGRPCStats{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_total_requests",
			Help: "Calls of the gRPC rate limit service (Envoy ratelimit's name).",
		}, []string{"grpc_method"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_service_response_time_seconds",
			Help:    "Time the gRPC rate limit service took to answer a call (Envoy ratelimit's name).",
			Buckets: prometheus.DefBuckets,
		}, []string{"grpc_method"}),
	}
	for _, c := range []prometheus.Collector{s.total, s.latency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register Envoy's gRPC metrics: %w", err)
		}
	}
	return s, nil
}

// methodKey keys the method of a call in its context.
type methodKey struct{}

// TagRPC notes the rate limit service's method of a call, its name alone
// (ShouldRateLimit), as Envoy's stats name it.
func (s *envoyGRPCStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if m, ok := strings.CutPrefix(info.FullMethodName, rlsServicePrefix); ok {
		return context.WithValue(ctx, methodKey{}, m)
	}
	return ctx
}

// HandleRPC counts a call of the rate limit service at its end.
func (s *envoyGRPCStats) HandleRPC(ctx context.Context, st stats.RPCStats) {
	end, ok := st.(*stats.End)
	if !ok {
		return
	}
	m, ok := ctx.Value(methodKey{}).(string)
	if !ok {
		return
	}
	s.total.WithLabelValues(m).Inc()
	s.latency.WithLabelValues(m).Observe(end.EndTime.Sub(end.BeginTime).Seconds())
}

// TagConn watches no connection.
func (s *envoyGRPCStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

// HandleConn watches no connection.
func (s *envoyGRPCStats) HandleConn(context.Context, stats.ConnStats) {}
