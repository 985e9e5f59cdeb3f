package server

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// collector is an OTLP/gRPC trace receiver on loopback that keeps the
// spans it is sent.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string // service.name of each span's resource
}

// Export implements coltracepb.TraceServiceServer.
func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		name := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				name = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, s)
				c.service = append(c.service, name)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startCollector serves a collector on a free loopback port until the test
// ends.
func startCollector(t *testing.T) (*collector, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return c, ln.Addr().String()
}

// TestServeTracing runs serve with an OTLP endpoint and checks that a
// decision under Envoy's sampled span reaches the collector as that span's
// child, with its store call, by the time serve has stopped.
func TestServeTracing(t *testing.T) {
	t.Parallel()
	col, addr := startCollector(t)
	c := testConfig(exampleRules)
	c.Tracing.Endpoint, c.Tracing.ServiceName = "http://"+addr, "rls"
	s := startServer(t, c)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "192.0.2.7")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.stop(); err != nil { // flushes the spans
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	var decideID []byte
	for i, sp := range col.spans {
		if sp.GetName() == "sluice.decide" {
			if hex.EncodeToString(sp.GetTraceId()) != traceID || hex.EncodeToString(sp.GetParentSpanId()) != parentID {
				t.Errorf("sluice.decide in trace %x under %x, want Envoy's %s under %s", sp.GetTraceId(), sp.GetParentSpanId(), traceID, parentID)
			}
			if col.service[i] != "rls" {
				t.Errorf("service.name %q, want rls", col.service[i])
			}
			decideID = sp.GetSpanId()
		}
	}
	if decideID == nil {
		t.Fatalf("no sluice.decide span among %d exported", len(col.spans))
	}
	found := false
	for _, sp := range col.spans {
		found = found || (sp.GetName() == "sluice.store.take_all" || sp.GetName() == "sluice.store.take") && string(sp.GetParentSpanId()) == string(decideID)
	}
	if !found {
		t.Errorf("no store span under the decision among %d spans", len(col.spans))
	}
}

// TestTracingRefusals checks the tracing settings New refuses.
func TestTracingRefusals(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]TracingConfig{
		"endpoint without a scheme": {Endpoint: "collector:4317"},
		"unknown protocol":          {Endpoint: "http://c:4317", Protocol: "zipkin"},
		"ratio above 1":             {Endpoint: "http://c:4317", SampleRatio: 2},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := testConfig(exampleRules)
			c.Tracing = tc
			wantConfigError(t, c)
		})
	}
}
