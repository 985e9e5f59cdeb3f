package tracing

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// DefaultSampleRatio is the share of decisions without a parent span that
// are traced by default: 1%. A traced decision costs several times an
// untraced one on the memory store (BenchmarkDecide: 12 allocations and
// about 2.5 KiB more, some microseconds of CPU), so tracing every one would
// multiply sluice's CPU; decisions under a sampled Envoy span are traced
// whatever the ratio.
const DefaultSampleRatio = 0.01

// Config configures the export of spans over OTLP.
type Config struct {
	// Endpoint is the collector's URL: http://host:4317 for OTLP/gRPC in
	// plaintext, https://... over TLS (for OTLP/HTTP, the traces path is
	// added unless the URL has one). Required.
	Endpoint string
	// Protocol is "grpc" (the default) or "http" (OTLP/HTTP, protobuf).
	Protocol string
	// SampleRatio is the share of decisions without a parent span that
	// are traced, between 0 and 1; a decision whose parent (Envoy's span)
	// was sampled is traced, one whose parent was not is not. Zero means
	// DefaultSampleRatio; a negative ratio traces only sampled parents.
	SampleRatio float64
	// ServiceName is the service.name of the spans. Default "sluice".
	ServiceName string
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means. Endpoint has none: it is required.
func DefaultConfig() Config {
	return Config{
		Protocol:    "grpc",             // OTLP/gRPC, the collectors' first
		SampleRatio: DefaultSampleRatio, // 1%: spans cost; Envoy's sampled parents are always traced
		ServiceName: "sluice",
	}
}

// NewProvider returns a TracerProvider that batches spans and exports them
// to cfg.Endpoint. It does not connect until it exports; the caller calls
// its Shutdown, which exports what is left.
func NewProvider(ctx context.Context, cfg Config) (*sdktrace.TracerProvider, error) {
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("tracing: no endpoint")
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tracing: endpoint %q: want an http:// or https:// URL", cfg.Endpoint)
	}
	ratio := cfg.SampleRatio
	switch {
	case ratio == 0:
		ratio = DefaultSampleRatio
	case ratio < 0:
		ratio = 0
	case ratio > 1 || math.IsNaN(ratio):
		return nil, fmt.Errorf("tracing: sample ratio %v: want a number between 0 and 1", cfg.SampleRatio)
	}
	name := cfg.ServiceName
	if name == "" {
		name = DefaultConfig().ServiceName
	}
	var exp *otlptrace.Exporter
	switch strings.ToLower(cfg.Protocol) {
	case "", "grpc":
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	case "http", "http/protobuf":
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces" // OTLP/HTTP's path for traces
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	default:
		return nil, fmt.Errorf("tracing: protocol %q: want grpc or http", cfg.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", name))
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(5*time.Second)), // at most 5 s late; 2,048 spans queued at most, as the SDK defaults
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	), nil
}
