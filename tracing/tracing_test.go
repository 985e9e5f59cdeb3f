package tracing_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rulesYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// traced returns the real decision service on a memory store composed by
// store/stack, both watched by a Tracer of tp: the Service as a Starter,
// the stack's calls as a Watcher.
func traced(t testing.TB, tp trace.TracerProvider) *decide.Service {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	tr := tracing.NewTracer(tp)
	st, err := stack.New(stack.Config{URL: "memory", Watchers: []stack.Watcher{tr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close(context.Background()) })
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = st
	dc.Logger = slog.New(slog.DiscardHandler)
	dc.Observers = []decide.Observer{tr}
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func request(user string) *decide.Request {
	return &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: user}}, Cost: 1}}}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpans checks a decision's span, its store call's child span, and
// that Envoy's trace context in gRPC metadata is the decision's parent.
func TestSpans(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	d := traced(t, tp)

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", traceparent))
	for range 2 { // OK, then OVER_LIMIT
		if _, err := d.Decide(ctx, request("alice")); err != nil {
			t.Fatal(err)
		}
	}
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4 (two decisions, each with a store call)", len(spans))
	}
	for i, code := range []string{"OK", "OVER_LIMIT"} {
		store, dec := spans[2*i], spans[2*i+1] // the child ends first
		if dec.Name() != tracing.SpanDecide || store.Name() != tracing.SpanStoreTakeAll && store.Name() != tracing.SpanStoreTake {
			t.Fatalf("spans %q, %q", store.Name(), dec.Name())
		}
		if got := dec.Parent().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" || dec.Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("decision's parent %v, want Envoy's span from traceparent", dec.Parent())
		}
		if store.Parent().SpanID() != dec.SpanContext().SpanID() {
			t.Errorf("store call's parent %v, want the decision's span", store.Parent().SpanID())
		}
		a := attrs(dec)
		if a["sluice.domain"].AsString() != "api" || a["sluice.code"].AsString() != code || a["sluice.descriptors"].AsInt64() != 1 ||
			a["sluice.mode"].AsString() != "store" {
			t.Errorf("decision %d attributes %v", i, dec.Attributes())
		}
		if attrs(store)["sluice.requests"].AsInt64() != 1 {
			t.Errorf("store call attributes %v", store.Attributes())
		}
	}
}

// TestNotSampled checks that a decision Envoy did not sample records
// nothing.
func TestNotSampled(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	d := traced(t, tp)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"))
	if _, err := d.Decide(ctx, request("bob")); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans of an unsampled decision, want 0", n)
	}
}

func TestNewProviderRefusals(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]tracing.Config{
		"no endpoint":    {},
		"not a URL":      {Endpoint: "collector:4317"},
		"bad protocol":   {Endpoint: "http://c:4317", Protocol: "thrift"},
		"ratio above 1":  {Endpoint: "http://c:4317", SampleRatio: 2},
		"scheme missing": {Endpoint: "//c:4317"},
	} {
		if tp, err := tracing.NewProvider(context.Background(), cfg); err == nil {
			tp.Shutdown(context.Background())
			t.Errorf("%s: NewProvider succeeded", name)
		}
	}
}

// discard is an exporter that drops spans, for measuring what producing
// them costs.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkDecide measures a decision of one descriptor on the memory
// store without tracing, traced and sampled (batched to an exporter that
// drops the spans), and traced but not sampled.
func BenchmarkDecide(b *testing.B) {
	users := make([]*decide.Request, 10000)
	for i := range users {
		users[i] = request("user-" + strconv.Itoa(i))
	}
	run := func(b *testing.B, d interface {
		Decide(context.Context, *decide.Request) (*decide.Response, error)
	}) {
		b.ReportAllocs()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			if _, err := d.Decide(ctx, users[i%len(users)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	}
	b.Run("off", func(b *testing.B) {
		run(b, testenv.Decider(b, rulesYAML, nil))
	})
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"sampled", sdktrace.AlwaysSample()},
		{"unsampled", sdktrace.NeverSample()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(tc.sampler))
			defer tp.Shutdown(context.Background())
			d := traced(b, tp)
			run(b, d)
		})
	}
}
