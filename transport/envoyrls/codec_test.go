package envoyrls

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
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
	neg := desc("user", "alice")
	neg.IsNegativeHits = true
	tests := []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), neg}}, "descriptors[1].is_negative_hits"},
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
			resp := Encode(in, Config{})
			for _, cfg := range []Config{{}, {Headers: AllHeaders}} {
				if one, many := encodeOne(in, cfg), encodeMany(in, cfg); !proto.Equal(one, many) {
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

func TestHeaderFields(t *testing.T) {
	t.Parallel()
	perUser := limit("per-user", "l1", "minute", 1, 100, time.Minute)
	perIP := limit("", "api/ip", "second", 1, 10, time.Second)
	shadow := limit("shadow", "l3", "day", 1, 5, 24*time.Hour)
	twoLimits := &decide.Response{Overall: decide.OK, Statuses: []decide.Status{
		{Code: decide.OK, Limit: perUser, Decision: sluice.Decision{Allowed: true, Limit: 100, Remaining: 40, ResetAfter: 11500 * time.Millisecond}},
		{Code: decide.OK, Limit: perIP, Decision: sluice.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 200 * time.Millisecond}},
		{Code: decide.OK, Limit: shadow, Shadow: true, ShadowOverLimit: true, Decision: sluice.Decision{Limit: 5, ResetAfter: time.Hour}},
		{Code: decide.OK},
	}}
	denied := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OverLimit, Limit: perUser, Decision: sluice.Decision{Limit: 100, Remaining: 0, ResetAfter: 12 * time.Second, RetryAfter: 2500 * time.Millisecond}},
	}}
	never := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OverLimit, Limit: perUser, Decision: sluice.Decision{Limit: 100, Remaining: 0, ResetAfter: 12 * time.Second, RetryAfter: sluice.Never}},
	}}
	overBeatsFewer := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OK, Limit: perIP, Decision: sluice.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: time.Second}},
		{Code: decide.OverLimit, Limit: perUser, Decision: sluice.Decision{Limit: 100, Remaining: 5, ResetAfter: 20 * time.Second, RetryAfter: 20 * time.Second}},
	}}
	tests := []struct {
		name    string
		resp    *decide.Response
		headers Headers
		want    [][2]string
	}{
		{
			name: "all headers, two limits, shadow and unmatched left out", resp: twoLimits, headers: AllHeaders,
			want: [][2]string{
				{"RateLimit-Policy", `"per-user";q=100;w=60, "api/ip";q=10;w=1`},
				{"RateLimit", `"per-user";r=40;t=12, "api/ip";r=3;t=1`},
				{"X-RateLimit-Limit", "10"},
				{"X-RateLimit-Remaining", "3"},
				{"X-RateLimit-Reset", "1"},
			},
		},
		{
			name: "only the draft's fields", resp: twoLimits, headers: RateLimitHeaders,
			want: [][2]string{
				{"RateLimit-Policy", `"per-user";q=100;w=60, "api/ip";q=10;w=1`},
				{"RateLimit", `"per-user";r=40;t=12, "api/ip";r=3;t=1`},
			},
		},
		{
			name: "denied gets Retry-After rounded up", resp: denied, headers: XRateLimitHeaders | RetryAfterHeader,
			want: [][2]string{
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "0"},
				{"X-RateLimit-Reset", "12"},
				{"Retry-After", "3"},
			},
		},
		{
			name: "the denying limit binds before the one with fewer remaining", resp: overBeatsFewer, headers: XRateLimitHeaders,
			want: [][2]string{
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "5"},
				{"X-RateLimit-Reset", "20"},
			},
		},
		{
			name: "no Retry-After when waiting never helps", resp: never, headers: RetryAfterHeader,
			want: nil,
		},
		{
			name: "none", resp: denied, headers: 0,
			want: nil,
		},
		{
			name: "no enforced limit, no headers", resp: &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{Code: decide.OK}}}, headers: AllHeaders,
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := HeaderFields(tt.resp, Config{Headers: tt.headers})
			if len(got) != len(tt.want) {
				t.Fatalf("headers %q, want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("header %d: %q, want %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestRetryAfterJitter(t *testing.T) {
	t.Parallel()
	resp := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OverLimit, Limit: limit("", "l", "second", 1, 1, time.Second), Decision: sluice.Decision{Limit: 1, ResetAfter: time.Second, RetryAfter: 1500 * time.Millisecond}},
	}}
	seen := map[int64]bool{}
	for range 200 {
		h := HeaderFields(resp, Config{Headers: RetryAfterHeader, RetryJitter: 3 * time.Second})
		if len(h) != 1 || h[0][0] != "Retry-After" {
			t.Fatalf("headers %q, want Retry-After only", h)
		}
		s, err := strconv.ParseInt(h[0][1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if s < 2 || s > 5 {
			t.Fatalf("Retry-After %d, want 2..5 (never before the real 1.5s, at most 3s of jitter)", s)
		}
		seen[s] = true
	}
	if len(seen) < 2 {
		t.Errorf("Retry-After took only the values %v in 200 tries: no jitter", seen)
	}
}

func TestParseHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    Headers
		wantErr bool
	}{
		{name: "all", in: "all", want: AllHeaders},
		{name: "none", in: "none", want: 0},
		{name: "empty", in: "", want: 0},
		{name: "list", in: "ratelimit, Retry-After", want: RateLimitHeaders | RetryAfterHeader},
		{name: "unknown", in: "ratelimit,x-foo", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseHeaders(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseHeaders(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseHeaders(%q) = %v, want %v", tt.in, got, tt.want)
			}
			if !tt.wantErr {
				if back, err := ParseHeaders(got.String()); err != nil || back != got {
					t.Errorf("ParseHeaders(%q) = %v, %v; want %v", got.String(), back, err, got)
				}
			}
		})
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
	cfg := DefaultConfig()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := Decode(req); err != nil {
				b.Fatal(err)
			}
			if out := Encode(resp, cfg); len(out.Statuses) != 1 {
				b.Fatal("no status")
			}
		}
	})
}
