// Package tracing records OpenTelemetry spans for sluice's decisions and
// store calls: a Decider decorates the decision service and a Store
// decorates the store, as package metrics does. Tracing is off unless the
// decorators are put in place, so it costs nothing when off; when on,
// each span carries only attributes that cost no formatting (the domain as
// it came, counts, the verdict's name), and none at all when the span is
// not sampled. Envoy's trace context, which Envoy's rate limit filter
// sends as gRPC metadata (W3C traceparent), is the parent of a
// decision's span.
package tracing

import (
	"context"

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

// Service is what a Decider decorates: *decide.Service's Decide method.
type Service interface {
	Decide(ctx context.Context, r *decide.Request) (*decide.Response, error)
}

// Decider records a span for each decision of a Service. It is safe for
// concurrent use.
type Decider struct {
	next   Service
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewDecider returns a Decider that traces the decisions of next with tp's
// tracer.
func NewDecider(next Service, tp trace.TracerProvider) *Decider {
	return &Decider{next: next, tracer: tp.Tracer(Scope), prop: propagation.TraceContext{}}
}

// Decide decides r with the decorated Service inside a span.
func (d *Decider) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = d.prop.Extract(ctx, metadataCarrier(md))
		}
	}
	ctx, span := d.tracer.Start(ctx, SpanDecide, serverKind...)
	resp, err := d.next.Decide(ctx, r)
	if span.IsRecording() {
		if err != nil {
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
	return resp, err
}

// Mode passes on the decorated Service's Mode, if it has one.
func (d *Decider) Mode() decide.Mode {
	if m, ok := d.next.(interface{ Mode() decide.Mode }); ok {
		return m.Mode()
	}
	return decide.ModeStore
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

// Store records a span for each call of a sluice.Store, as a child of the
// decision's span; a call outside a sampled span records nothing and costs
// a context lookup. It is safe for concurrent use as its store is, and
// passes on the store's optional abilities.
type Store struct {
	next   sluice.Store
	tracer trace.Tracer
}

var (
	_ sluice.Store        = (*Store)(nil)
	_ decide.NonBlocking  = (*Store)(nil)
	_ decide.Ready        = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// NewStore returns next traced with tp's tracer.
func NewStore(next sluice.Store, tp trace.TracerProvider) *Store {
	return &Store{next: next, tracer: tp.Tracer(Scope)}
}

// TakeAll implements sluice.Store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return s.next.TakeAll(ctx, reqs, ds)
	}
	ctx, span := s.tracer.Start(ctx, SpanStoreTakeAll, clientKind...)
	err := s.next.TakeAll(ctx, reqs, ds)
	end(span, err, len(reqs))
	return err
}

// end ends a store call's span.
func end(span trace.Span, err error, n int) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("sluice.requests", n))
		if err != nil {
			span.SetStatus(codes.Error, "store call failed")
			span.RecordError(err)
		}
	}
	span.End()
}

// NonBlocking reports whether the decorated store never blocks.
func (s *Store) NonBlocking() bool {
	nb, ok := s.next.(decide.NonBlocking)
	return ok && nb.NonBlocking()
}

// Ready reports whether the decorated store can decide; a store without
// Ready always can.
func (s *Store) Ready() bool {
	r, ok := s.next.(decide.Ready)
	return !ok || r.Ready()
}

// CheckLimit passes on the decorated store's veto on limits.
func (s *Store) CheckLimit(l sluice.Limit) error {
	if lc, ok := s.next.(sluice.LimitChecker); ok {
		return lc.CheckLimit(l)
	}
	return nil
}
