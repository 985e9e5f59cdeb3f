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

	"github.com/sluicehq/sluice/decide"
)

// Decider decides on rate limit requests; *decide.Service is one. An error
// means the request was invalid.
type Decider interface {
	Decide(ctx context.Context, req *decide.Request) (*decide.Response, error)
}

// ServiceName is the gRPC service name of Envoy's rate limit service, as
// health checks ask for it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Server implements RateLimitService on a Decider, and the standard gRPC
// health service. It is safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	d      Decider
	cfg    Config
	health *health.Server
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server that asks d and answers as cfg says. Its health
// service reports SERVING for "" and ServiceName until Shutdown.
func New(d Decider, cfg Config) *Server {
	s := &Server{d: d, cfg: cfg, health: health.NewServer()}
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
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
	return Encode(resp, s.cfg), nil
}
