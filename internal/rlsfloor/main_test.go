package main

import (
	"context"
	"net"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestAnswersOK calls the floor as Envoy would and checks that the answer
// decodes as an OK with one OK status, which sluice bench's first call checks.
func TestAnswersOK(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := newServer()
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis) //nolint:errcheck // Stop ends it
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	for range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user-1"}},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 ||
			resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("answer %v, want OK with one OK status", resp)
		}
	}
}
