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
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec that codec wraps
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

// MaxRequestBytes is the largest RateLimitRequest, in bytes, that a gRPC
// server made with ServerOptions accepts (grpc.MaxRecvMsgSize): a larger
// one is refused with ResourceExhausted before it is read. It is gRPC's
// own default, 4 MiB, stated here: Envoy's requests are a few hundred
// bytes, and a request beyond decide's caps (descriptors, entries, value
// bytes) but within this reaches decide, which refuses it with
// InvalidArgument naming the cap, before anything is counted or stored.
const MaxRequestBytes = 4 << 20

// ServerOptions returns the options of a gRPC server that serves a Server:
// requests up to MaxRequestBytes, and a codec that lets ShouldRateLimit
// answer InvalidArgument for a request that does not decode (not protobuf,
// or a string that is not valid UTF-8), as the HTTP API answers 400 for
// it. Without it such a request gets gRPC's Internal. The codec is
// protobuf's for every other message and service.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.ForceServerCodecV2(codec{proto: encoding.GetCodecV2("proto")}),
	}
}

// Register registers the rate limit service and the health service on g,
// a server made with ServerOptions.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	g.RegisterService(&serviceDesc, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// serviceDesc describes RateLimitService as go-control-plane's generated
// code does, with the handler below.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimit}},
	Streams:     []grpc.StreamDesc{},
	Metadata:    "envoy/service/ratelimit/v3/rls.proto",
}

// decoded is a call's request and what went wrong decoding it. It is a
// proto.Message (its request's), so that any codec can fill it; codec
// keeps the error for ShouldRateLimit to answer instead of failing the
// call with Internal.
type decoded struct {
	rlsv3.RateLimitRequest
	err error
}

// codec is protobuf's gRPC codec, except that it decodes a *decoded
// without failing.
type codec struct{ proto encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }
func (c codec) Name() string                           { return c.proto.Name() }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	d, ok := v.(*decoded)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), &d.RateLimitRequest); err != nil {
		d.err = fmt.Errorf("decode RateLimitRequest: %w", err)
	}
	return nil
}

// shouldRateLimit decodes a call's request and passes it to
// ShouldRateLimit through the server's interceptors, or answers
// InvalidArgument when it does not decode.
func shouldRateLimit(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(decoded)
	if err := dec(in); err != nil {
		return nil, err
	}
	if in.err != nil {
		return nil, status.Error(codes.InvalidArgument, in.err.Error())
	}
	s := srv.(rlsv3.RateLimitServiceServer)
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, &in.RateLimitRequest)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, &in.RateLimitRequest, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
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
