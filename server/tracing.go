package server

import (
	"context"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/tracing"
)

// newTracerProvider returns the tracer provider c asks for, or nil when
// tracing is off, and the function that flushes and stops it.
func newTracerProvider(c TracingConfig) (*sdktrace.TracerProvider, func() error, error) {
	if c.Endpoint == "" {
		return nil, nil, nil
	}
	tp, err := tracing.NewProvider(context.Background(), tracing.Config{
		Endpoint: c.Endpoint, Protocol: c.Protocol, SampleRatio: c.SampleRatio, ServiceName: c.ServiceName,
	})
	if err != nil {
		return nil, nil, configError("%v", err)
	}
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the last export's bound
		defer cancel()
		return tp.Shutdown(ctx)
	}
	return tp, stop, nil
}
