package envoyrls

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// fakeDecider is a Decider whose answer is a function.
type fakeDecider struct {
	decide func(context.Context, *decide.Request) (*decide.Response, error)
}

func (f fakeDecider) Decide(ctx context.Context, req *decide.Request) (*decide.Response, error) {
	return f.decide(ctx, req)
}

// serve starts s on a loopback port and returns a client connected to it;
// both stop when the test ends.
func serve(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.GracefulStop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

func TestShouldRateLimit(t *testing.T) {
	t.Parallel()
	lim := limit("per-user", "l1", "minute", 1, 2, time.Minute)
	// The fake admits the first cost-2 worth of hits per domain, as a
	// fixed window of 2 would, and reports each request it saw.
	var (
		mu   sync.Mutex
		seen []*decide.Request
		used int64
	)
	d := fakeDecider{decide: func(ctx context.Context, req *decide.Request) (*decide.Response, error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, req)
		switch {
		case req.Domain == "":
			return nil, errors.New("invalid request: no domain")
		case req.Domain == "broken":
			return nil, errors.New("unknown descriptor shape")
		}
		resp := &decide.Response{Overall: decide.OK}
		for _, desc := range req.Descriptors {
			st := decide.Status{Code: decide.OK, Limit: lim}
			if used+desc.Cost > 2 {
				st.Code = decide.OverLimit
				resp.Overall = decide.OverLimit
				st.Decision = sluice.Decision{Limit: 2, Remaining: 2 - used, ResetAfter: 30 * time.Second, RetryAfter: 30 * time.Second}
			} else {
				used += desc.Cost
				st.Decision = sluice.Decision{Allowed: true, Limit: 2, Remaining: 2 - used, ResetAfter: 30 * time.Second}
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		return resp, nil
	}}
	client := rlsv3.NewRateLimitServiceClient(serve(t, New(d, Config{})))
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}}

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if resp.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i, resp.OverallCode, want)
		}
		if got := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 2 {
			t.Errorf("call %d: requests_per_unit %d, want 2", i, got)
		}
		hasRetry := false
		for _, h := range resp.ResponseHeadersToAdd {
			hasRetry = hasRetry || h.Key == "Retry-After"
		}
		if hasRetry != (want == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Errorf("call %d: headers %v: Retry-After present %v, want %v", i, resp.ResponseHeadersToAdd, hasRetry, !hasRetry)
		}
	}
	mu.Lock()
	first := seen[0].Descriptors[0]
	mu.Unlock()
	if got := first; got.Cost != 1 || got.Entries[0] != (decide.Entry{Key: "user", Value: "alice"}) {
		t.Errorf("decider saw %+v, want user=alice cost 1", got)
	}

	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{"no domain, as the decider says", &rlsv3.RateLimitRequest{Descriptors: req.Descriptors}, codes.InvalidArgument, "invalid request: no domain"},
		{"hits_addend too large", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("user", "x"), 1<<33)}}, codes.InvalidArgument, "descriptors[0].hits_addend: 8589934592 is too large"},
		{"decider refuses", &rlsv3.RateLimitRequest{Domain: "broken", Descriptors: req.Descriptors}, codes.InvalidArgument, "unknown descriptor shape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.ShouldRateLimit(ctx, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Errorf("error %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}
}

func TestShouldRateLimitCancelled(t *testing.T) {
	t.Parallel()
	d := fakeDecider{decide: func(ctx context.Context, req *decide.Request) (*decide.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	client := rlsv3.NewRateLimitServiceClient(serve(t, New(d, DefaultConfig())))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}})
	if got := status.Code(err); got != codes.DeadlineExceeded {
		t.Errorf("error %v, want DeadlineExceeded", err)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	s := New(fakeDecider{}, DefaultConfig())
	client := healthpb.NewHealthClient(serve(t, s))
	ctx := context.Background()
	names := []string{"", ServiceName, "ratelimit"} // "ratelimit": Envoy's ratelimit's name
	for _, svc := range names {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	s.Shutdown()
	for _, svc := range names[1:] {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("after Shutdown, Check(%q) = %v, %v; want NOT_SERVING", svc, resp, err)
		}
	}
}

// rawCodec sends a call's request as the bytes given, so that a test can
// send what a protobuf library would refuse to encode; answers decode as
// protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)   { return v.([]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (rawCodec) Name() string                    { return "proto" }

// TestUndecodableRequests sends requests that do not decode, over a real
// gRPC client and server: each gets InvalidArgument, as the HTTP API's 400,
// where gRPC's generated handler answered Internal; the decider is never
// asked.
func TestUndecodableRequests(t *testing.T) {
	t.Parallel()
	var asked sync.Mutex
	d := fakeDecider{decide: func(context.Context, *decide.Request) (*decide.Response, error) {
		asked.Lock()
		defer asked.Unlock()
		t.Error("the decider was asked")
		return nil, errors.New("asked")
	}}
	conn := serve(t, New(d, Config{}))
	str := func(b []byte, num protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, m)
	}
	entry := str(str(nil, 1, "user"), 2, "al\xffice")
	tests := []struct {
		name string
		body []byte
	}{
		{"invalid UTF-8 in the domain", str(nil, 1, "ap\xc3i")},
		{"invalid UTF-8 in a value", msg(str(nil, 1, "api"), 2, msg(nil, 1, entry))},
		{"not protobuf", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out rlsv3.RateLimitResponse
			err := conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, tt.body, &out, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v, want InvalidArgument", err)
			}
		})
	}
	// The same server still answers a valid request.
	ok := fakeDecider{decide: func(context.Context, *decide.Request) (*decide.Response, error) {
		return &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{Code: decide.OK}}}, nil
	}}
	resp, err := rlsv3.NewRateLimitServiceClient(serve(t, New(ok, Config{}))).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("valid request: %v, %v", resp, err)
	}
}
