package server

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/connectivity"
)

// TestMaxConnectionAge checks that serve closes a gRPC connection once it
// is --grpc-max-connection-age old, so that the client connects anew.
func TestMaxConnectionAge(t *testing.T) {
	t.Parallel()
	c := testConfig(exampleRules)
	c.GRPC.MaxConnectionAge, c.GRPC.MaxConnectionAgeGrace = 100*time.Millisecond, time.Second
	s := startServer(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "192.0.2.8")},
	}); err != nil {
		t.Fatal(err)
	}
	if st := s.conn.GetState(); st != connectivity.Ready {
		t.Fatalf("connection %v after a call, want READY", st)
	}
	// The server's GOAWAY at the connection's age moves it out of READY.
	if !s.conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatal("the connection stayed READY past its maximum age")
	}
}
