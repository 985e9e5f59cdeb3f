package main

import (
	"context"
	"time"

	"github.com/peterbourgon/ff/v4"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/tracing"
)

// traceFlags are the flags of OpenTelemetry tracing, off unless
// --otlp-endpoint is set.
type traceFlags struct {
	endpoint    string
	protocol    string
	sampleRatio float64
	serviceName string
}

func (c *traceFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&c.endpoint, 0, "otlp-endpoint", "", withEnv("otlp-endpoint",
		"OTLP collector URL (http://collector:4317): trace decisions and store calls; none: no tracing, at no cost"))
	fs.StringVar(&c.protocol, 0, "otlp-protocol", "grpc", withEnv("otlp-protocol", "grpc or http (OTLP/HTTP)"))
	fs.Float64Var(&c.sampleRatio, 0, "trace-sample-ratio", tracing.DefaultSampleRatio, withEnv("trace-sample-ratio",
		"share of decisions without a parent span that are traced (under a sampled parent, all are)"))
	fs.StringVar(&c.serviceName, 0, "trace-service-name", "sluice", withEnv("trace-service-name", "service.name of the spans"))
}

// provider returns the tracer provider the flags ask for, or nil when
// tracing is off, and the function that flushes and stops it.
func (c traceFlags) provider() (*sdktrace.TracerProvider, func() error, error) {
	if c.endpoint == "" {
		return nil, nil, nil
	}
	ratio := c.sampleRatio
	if ratio == 0 {
		ratio = -1 // the flag's 0 means none; Config's 0 means the default
	}
	tp, err := tracing.NewProvider(context.Background(), tracing.Config{
		Endpoint: c.endpoint, Protocol: c.protocol, SampleRatio: ratio, ServiceName: c.serviceName,
	})
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the last export's bound
		defer cancel()
		return tp.Shutdown(ctx)
	}
	return tp, stop, nil
}
