// Package envoyrls serves Envoy's rate limit service API,
// envoy.service.ratelimit.v3.RateLimitService, over gRPC with
// go-control-plane's generated types, so that an Envoy proxy configured for
// Envoy's own ratelimit service works with sluice unchanged. Decode and
// Encode, the mapping between Envoy's messages and package decide, are
// exported for the HTTP API, which speaks the same messages in JSON.
package envoyrls

import (
	"context"
	"errors"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/transport/respond"
)

// Config configures the Envoy rate limit service. The zero value is the
// default.
type Config struct {
	// Respond computes the rate limit headers added to the client's
	// response (response_headers_to_add): the fields the HTTP ways in
	// send, with the same vocabulary of header sets. Nil:
	// respond.New(respond.Config{}), every field and 1 s of jitter.
	Respond *respond.Writer
}

// DefaultConfig returns the configuration sluice serve uses: the zero
// value.
func DefaultConfig() Config { return Config{} }

// ServiceName is the gRPC service name of Envoy's rate limit service, as
// health checks ask for it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// HealthName is the service name under which Envoy's ratelimit service
// reports its gRPC health, so that probes and Envoy health checks written
// for it ask sluice the same question.
const HealthName = "ratelimit"

// Server implements RateLimitService on a Decider, and the standard gRPC
// health service. It is safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	d      respond.Decider
	w      *respond.Writer
	health *health.Server
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server that asks d (*decide.Service is one; its errors
// mean the request was invalid) and answers as cfg says. Its health
// service reports SERVING for "", ServiceName and HealthName until
// Shutdown.
func New(d respond.Decider, cfg Config) *Server {
	if cfg.Respond == nil {
		cfg.Respond = respond.New(respond.Config{})
	}
	s := &Server{d: d, w: cfg.Respond, health: health.NewServer()}
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HealthName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Register registers the rate limit service and the health service on g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// Shutdown makes the health service report NOT_SERVING, so that load
// balancers stop sending calls; calls still arriving are answered.
func (s *Server) Shutdown() { s.health.Shutdown() }

// ShouldRateLimit decides on req. Invalid requests (no domain, no
// descriptors, a descriptor without entries, an entry without a key, and
// what Decode rejects) get InvalidArgument with a message saying what is
// wrong; a cancelled or expired call gets Canceled or DeadlineExceeded.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	dr, err := Decode(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := s.d.Decide(ctx, dr)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, status.FromContextError(err).Err()
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return Encode(resp, s.w), nil
}
