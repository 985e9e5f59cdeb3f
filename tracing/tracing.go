// Package tracing records OpenTelemetry spans for sluice's decisions and
// store calls: a Tracer watches the decision service (a decide.Starter)
// and the store (a store/stack Watcher), as package metrics does. Tracing
// is off unless a Tracer is put in place, so it costs nothing when off; when on,
// each span carries only attributes that cost no formatting (the domain as
// it came, counts, the verdict's name), and none at all when the span is
// not sampled. Envoy's trace context, which Envoy's rate limit filter
// sends as gRPC metadata (W3C traceparent), is the parent of a
// decision's span.
package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Scope is the instrumentation scope of sluice's spans.
const Scope = "github.com/sluicehq/sluice"

// Span names.
const (
	SpanDecide       = "sluice.decide"
	SpanStoreTake    = "sluice.store.take"
	SpanStoreTakeAll = "sluice.store.take_all"
)

// The span kinds, made once: a slice made per call would cost an
// allocation per span.
var (
	serverKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// Tracer records a span for each decision, as a decide.Starter of the
// decision service (Start, Observe), and one for each call of the store
// under it, as a store/stack Watcher (StartCall, EndCall). It is safe for
// concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var _ decide.Starter = (*Tracer)(nil)

// NewTracer returns a Tracer that records with tp's tracer.
func NewTracer(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(Scope), prop: propagation.TraceContext{}}
}

// Start starts the span of a decision, as a child of the span in ctx or
// else of the trace context in ctx's incoming gRPC metadata, and returns
// the context that holds it: the decision runs in it, and Observe ends it.
// No other Starter of the Service may put a span in the context.
func (t *Tracer) Start(ctx context.Context, _ *decide.Request) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = t.prop.Extract(ctx, metadataCarrier(md))
		}
	}
	ctx, _ = t.tracer.Start(ctx, SpanDecide, serverKind...)
	return ctx
}

// Observe ends the decision's span, which Start put in ctx, with the
// request's domain, its count of descriptors, the verdict and the mode,
// or with the error of an invalid request.
func (t *Tracer) Observe(ctx context.Context, r *decide.Request, resp *decide.Response, err error) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		if err != nil || resp == nil {
			span.SetStatus(codes.Error, "invalid request")
			span.RecordError(err)
		} else {
			span.SetAttributes(
				attribute.String("sluice.domain", r.Domain),
				attribute.Int("sluice.descriptors", len(r.Descriptors)),
				attribute.String("sluice.code", resp.Overall.String()),
				attribute.String("sluice.mode", resp.Mode.String()),
			)
		}
	}
	span.End()
}

// StartCall starts the span of a store call as a child of the decision's,
// when that one is sampled; outside a sampled span it records nothing and
// costs a context lookup. It returns the context the call runs in.
func (t *Tracer) StartCall(ctx context.Context, _ []sluice.Request) context.Context {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return ctx
	}
	ctx, _ = t.tracer.Start(ctx, SpanStoreTakeAll, clientKind...)
	return ctx
}

// EndCall ends the span StartCall started in ctx, if any: a store call's
// span is started only under a sampled one, so a span in ctx that is not
// sampled is the decision's or none, and is left alone.
func (t *Tracer) EndCall(ctx context.Context, reqs []sluice.Request, _ time.Duration, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.SpanContext().IsSampled() {
		return
	}
	span.SetAttributes(attribute.Int("sluice.requests", len(reqs)))
	if err != nil {
		span.SetStatus(codes.Error, "store call failed")
		span.RecordError(err)
	}
	span.End()
}

// metadataCarrier reads W3C trace context from incoming gRPC metadata.
type metadataCarrier metadata.MD

// Get implements propagation.TextMapCarrier.
func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier; incoming metadata is not
// written.
func (c metadataCarrier) Set(string, string) {}

// Keys implements propagation.TextMapCarrier.
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
