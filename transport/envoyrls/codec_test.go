package envoyrls

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

// desc builds a descriptor from key/value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func TestDecodeCosts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		costs []int64
	}{
		{
			name:  "unset hits_addend is 1",
			req:   &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}},
			costs: []int64{1},
		},
		{
			name:  "request hits_addend applies to every descriptor",
			req:   &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice"), desc("ip", "::1")}},
			costs: []int64{5, 5},
		},
		{
			name: "descriptor hits_addend overrides the request's",
			req: &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{
				withHits(desc("user", "alice"), 2), desc("ip", "::1"),
			}},
			costs: []int64{2, 5},
		},
		{
			name: "descriptor hits_addend 0 checks without counting",
			req: &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				withHits(desc("user", "alice"), 0),
			}},
			costs: []int64{0},
		},
		{
			name: "largest descriptor hits_addend",
			req: &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				withHits(desc("user", "alice"), math.MaxUint32),
			}},
			costs: []int64{math.MaxUint32},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decode(tt.req)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.Domain != tt.req.Domain {
				t.Errorf("domain %q, want %q", got.Domain, tt.req.Domain)
			}
			if len(got.Descriptors) != len(tt.costs) {
				t.Fatalf("%d descriptors, want %d", len(got.Descriptors), len(tt.costs))
			}
			for i, d := range got.Descriptors {
				if d.Cost != tt.costs[i] {
					t.Errorf("descriptor %d: cost %d, want %d", i, d.Cost, tt.costs[i])
				}
				want := tt.req.Descriptors[i].Entries
				if len(d.Entries) != len(want) {
					t.Fatalf("descriptor %d: %d entries, want %d", i, len(d.Entries), len(want))
				}
				for j, e := range d.Entries {
					if e.Key != want[j].Key || e.Value != want[j].Value {
						t.Errorf("descriptor %d entry %d: %+v, want %s=%s", i, j, e, want[j].Key, want[j].Value)
					}
				}
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"limit in no unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), withLimit(desc("a", "b"), 1, 0)}}, "descriptors[1].limit.unit"},
		{"hits_addend too large", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("a", "b"), math.MaxUint32+1)}}, "descriptors[0].hits_addend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode(tt.req)
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("Decode error %v, want a *RequestError", err)
			}
			if re.Field != tt.field {
				t.Errorf("field %q, want %q (%v)", re.Field, tt.field, err)
			}
		})
	}
}

// TestDecodeLeavesValidationToDecide checks that requests decide rejects
// pass through Decode intact, for decide to reject and count.
func TestDecodeLeavesValidationToDecide(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		descs   int
		entries []int
	}{
		{"nil request", nil, 0, nil},
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}, 1, []int{1}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, 0, nil},
		{"nil descriptor", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{nil, desc("a", "b")}}, 2, []int{0, 1}},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b", "", "c")}}, 1, []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decode(tt.req)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.Domain != tt.req.GetDomain() || len(got.Descriptors) != tt.descs {
				t.Fatalf("Decode = %+v, want domain %q and %d descriptors", got, tt.req.GetDomain(), tt.descs)
			}
			for i, n := range tt.entries {
				if len(got.Descriptors[i].Entries) != n {
					t.Errorf("descriptor %d: %d entries, want %d", i, len(got.Descriptors[i].Entries), n)
				}
			}
		})
	}
}

func limit(name, id, unit string, mult, rate int64, period time.Duration) *rules.Limit {
	return &rules.Limit{
		Name: name, ID: id, Unit: unit, UnitMultiplier: mult,
		Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: rate, Period: period},
	}
}

func TestEncodeStatuses(t *testing.T) {
	t.Parallel()
	type want struct {
		code      rlsv3.RateLimitResponse_Code
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		mult      uint32 // 0: no unit_multiplier
		rate      uint32
		name      string
		remaining uint32
		reset     time.Duration
		noLimit   bool
	}
	tests := []struct {
		name string
		st   decide.Status
		want want
	}{
		{
			name: "per second",
			st:   decide.Status{Code: decide.OK, Limit: limit("per-ip", "l1", "second", 1, 100, time.Second), Decision: sluice.Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 700 * time.Millisecond}},
			want: want{code: rlsv3.RateLimitResponse_OK, unit: rlsv3.RateLimitResponse_RateLimit_SECOND, rate: 100, name: "per-ip", remaining: 99, reset: 700 * time.Millisecond},
		},
		{
			name: "five minutes is MINUTE times 5",
			st:   decide.Status{Code: decide.OverLimit, Limit: limit("", "l2", "minute", 5, 100, 5*time.Minute), Decision: sluice.Decision{Limit: 100, ResetAfter: 3 * time.Minute, RetryAfter: time.Second}},
			want: want{code: rlsv3.RateLimitResponse_OVER_LIMIT, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, mult: 5, rate: 100, reset: 3 * time.Minute},
		},
		{
			name: "month and year keep Envoy's units",
			st:   decide.Status{Code: decide.OK, Limit: limit("", "l3", "year", 1, 1000, 365*24*time.Hour), Decision: sluice.Decision{Allowed: true, Limit: 1000, Remaining: 999}},
			want: want{code: rlsv3.RateLimitResponse_OK, unit: rlsv3.RateLimitResponse_RateLimit_YEAR, rate: 1000, remaining: 999},
		},
		{
			name: "unknown unit is derived from the period",
			st:   decide.Status{Code: decide.OK, Limit: limit("", "l4", "", 0, 10, 90*time.Second), Decision: sluice.Decision{Allowed: true, Limit: 10, Remaining: 9}},
			want: want{code: rlsv3.RateLimitResponse_OK, unit: rlsv3.RateLimitResponse_RateLimit_SECOND, mult: 90, rate: 10, remaining: 9},
		},
		{
			name: "remaining saturates",
			st:   decide.Status{Code: decide.OK, Limit: limit("", "l5", "day", 1, 1<<40, 24*time.Hour), Decision: sluice.Decision{Allowed: true, Limit: 1 << 40, Remaining: 1<<40 - 1}},
			want: want{code: rlsv3.RateLimitResponse_OK, unit: rlsv3.RateLimitResponse_RateLimit_DAY, rate: math.MaxUint32, remaining: math.MaxUint32},
		},
		{
			name: "no rule matched",
			st:   decide.Status{Code: decide.OK},
			want: want{code: rlsv3.RateLimitResponse_OK, noLimit: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := &decide.Response{Overall: tt.st.Code, Statuses: []decide.Status{tt.st}}
			resp := Encode(in, nil)
			for _, w := range []*respond.Writer{nil, respond.New(respond.Config{RetryJitter: -1})} {
				if one, many := encodeOne(in, w), encodeMany(in, w); !proto.Equal(one, many) {
					t.Errorf("encodeOne %v\nencodeMany %v", one, many)
				}
			}
			if resp.OverallCode != tt.want.code {
				t.Errorf("overall %v, want %v", resp.OverallCode, tt.want.code)
			}
			if len(resp.Statuses) != 1 {
				t.Fatalf("%d statuses, want 1", len(resp.Statuses))
			}
			ds := resp.Statuses[0]
			if ds.Code != tt.want.code {
				t.Errorf("code %v, want %v", ds.Code, tt.want.code)
			}
			if tt.want.noLimit {
				if ds.CurrentLimit != nil || ds.DurationUntilReset != nil || ds.LimitRemaining != 0 {
					t.Errorf("status %v, want no limit", ds)
				}
				return
			}
			cl := ds.CurrentLimit
			if cl.GetUnit() != tt.want.unit || cl.GetRequestsPerUnit() != tt.want.rate || cl.GetName() != tt.want.name {
				t.Errorf("current limit %v, want %v %d/%v", cl, tt.want.name, tt.want.rate, tt.want.unit)
			}
			if got := cl.GetUnitMultiplier(); (got == nil) != (tt.want.mult == 0) || got.GetValue() != tt.want.mult {
				t.Errorf("unit multiplier %v, want %d", got, tt.want.mult)
			}
			if ds.LimitRemaining != tt.want.remaining {
				t.Errorf("remaining %d, want %d", ds.LimitRemaining, tt.want.remaining)
			}
			if got := ds.DurationUntilReset.AsDuration(); got != tt.want.reset {
				t.Errorf("reset %v, want %v", got, tt.want.reset)
			}
		})
	}
}

// TestEncodeHeaders: the headers Encode adds are the fields package respond
// computes, in its order, and none without a writer.
func TestEncodeHeaders(t *testing.T) {
	t.Parallel()
	resp := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OverLimit, Limit: limit("per-user", "l1", "minute", 1, 100, time.Minute), Decision: sluice.Decision{Limit: 100, ResetAfter: 12 * time.Second, RetryAfter: 2500 * time.Millisecond}},
	}}
	w := respond.New(respond.Config{RetryJitter: -1})
	want := [][2]string{
		{"RateLimit-Policy", `"per-user";q=100;w=60`},
		{"RateLimit", `"per-user";r=0;t=3`},
		{"X-RateLimit-Limit", "100"},
		{"X-RateLimit-Remaining", "0"},
		{"X-RateLimit-Reset", "3"},
		{"Retry-After", "3"},
	}
	for _, enc := range []func(*decide.Response, *respond.Writer) *rlsv3.RateLimitResponse{Encode, encodeMany} {
		var got [][2]string
		for _, h := range enc(resp, w).ResponseHeadersToAdd {
			got = append(got, [2]string{h.Key, h.Value})
		}
		if !slices.Equal(got, want) {
			t.Errorf("headers %q, want %q", got, want)
		}
		if hs := enc(resp, nil).ResponseHeadersToAdd; hs != nil {
			t.Errorf("without a writer: headers %v", hs)
		}
	}
}

// TestEncodeMode checks that a decision the store did not make says its
// fail mode in dynamic_metadata, with one status or several, and that one
// the store made carries none.
func TestEncodeMode(t *testing.T) {
	t.Parallel()
	st := decide.Status{Code: decide.OK}
	for _, n := range []int{1, 2} {
		for m := decide.ModeStore; m <= decide.MaxMode; m++ {
			resp := &decide.Response{Overall: decide.OK, Mode: m, Statuses: slices.Repeat([]decide.Status{st}, n)}
			md := Encode(resp, nil).GetDynamicMetadata()
			got := md.GetFields()[ModeKey].GetStringValue()
			if want := m.String(); m == decide.ModeStore && md != nil || m != decide.ModeStore && got != want {
				t.Errorf("%d statuses in mode %v: dynamic_metadata %v, want %s", n, m, md, map[bool]string{true: "none", false: ModeKey + ": " + want}[m == decide.ModeStore])
			}
		}
	}
}

// BenchmarkCodec decodes a one-descriptor request and encodes its answer
// with every header, as ShouldRateLimit does around each decision.
func BenchmarkCodec(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}}
	resp := &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{
		Code: decide.OK, Limit: limit("per-user", "l1", "second", 1, 30, time.Second),
		Decision: sluice.Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 33 * time.Millisecond},
	}}}
	w := respond.New(respond.Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := Decode(req); err != nil {
				b.Fatal(err)
			}
			if out := Encode(resp, w); len(out.Statuses) != 1 {
				b.Fatal("no status")
			}
		}
	})
}

// FuzzDecodeRequest feeds the gRPC request decoder arbitrary bytes, as a
// call's payload: the server's codec never fails a call (what does not
// decode is kept for an InvalidArgument), and what decodes converts
// into a decide.Request that keeps every descriptor and entry, with costs
// in the range of hits_addend, or is refused with a *RequestError.
func FuzzDecodeRequest(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}},
		{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("user", "alice", "path", "/login"), 2), desc("ip", "::1")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{IsNegativeHits: true, Entries: desc("k", "v").Entries}}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withLimit(desc("k", "v"), 7, typev3.RateLimitUnit_HOUR), {}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("\x0a\x02\xff\xfe"))
	c := codec{proto: encoding.GetCodecV2("proto")}
	f.Fuzz(func(t *testing.T, b []byte) {
		d := new(decoded)
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, d); err != nil {
			t.Fatalf("codec failed the call: %v", err)
		}
		if d.err != nil {
			return
		}
		req := &d.RateLimitRequest
		out, err := Decode(req)
		if err != nil {
			if _, ok := err.(*RequestError); !ok {
				t.Fatalf("Decode: %T %v, want a *RequestError", err, err)
			}
			return
		}
		if out.Domain != req.GetDomain() || len(out.Descriptors) != len(req.GetDescriptors()) {
			t.Fatalf("Decode(%v) = %+v", req, out)
		}
		for i, dd := range req.GetDescriptors() {
			got := out.Descriptors[i]
			if got.Cost < 0 || got.Cost > math.MaxUint32 || len(got.Entries) != len(dd.GetEntries()) || (dd.GetIsNegativeHits() && got.Cost != 0) {
				t.Fatalf("descriptor %d: %+v from %v", i, got, dd)
			}
			if o := dd.GetLimit(); (o == nil) != (got.Limit == nil) || (o != nil && (got.Limit.RequestsPerUnit != int64(o.GetRequestsPerUnit()) || got.Limit.Unit != strings.ToLower(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()).String()))) {
				t.Fatalf("descriptor %d: limit %+v from %v", i, got.Limit, o)
			}
			for j, e := range dd.GetEntries() {
				if got.Entries[j].Key != e.GetKey() || got.Entries[j].Value != e.GetValue() {
					t.Fatalf("descriptor %d entry %d: %+v from %v", i, j, got.Entries[j], e)
				}
			}
		}
	})
}
