package httpapi

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// protojsonCompact is the reference: protojson's bytes without whitespace.
func protojsonCompact(t testing.TB, r *rlsv3.RateLimitResponse) []byte {
	t.Helper()
	js, err := protojson.Marshal(r)
	if err != nil {
		t.Fatalf("protojson: %v", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, js); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestAppendResponseMatchesProtojson(t *testing.T) {
	t.Parallel()
	status := func(code rlsv3.RateLimitResponse_Code, name string, rate uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult *wrapperspb.UInt32Value, remaining uint32, reset *durationpb.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: code, LimitRemaining: remaining, DurationUntilReset: reset,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rate, Unit: unit, UnitMultiplier: mult},
		}
	}
	tests := []struct {
		name string
		resp *rlsv3.RateLimitResponse
		fast bool // whether the fast encoder takes it
	}{
		{"empty", &rlsv3.RateLimitResponse{}, true},
		{"typical", &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{status(rlsv3.RateLimitResponse_OK, "per-user", 30, rlsv3.RateLimitResponse_RateLimit_SECOND, nil, 99, durationpb.New(33334*time.Microsecond))},
			ResponseHeadersToAdd: []*corev3.HeaderValue{
				{Key: "RateLimit-Policy", Value: `"per-user";q=30;w=1`},
				{Key: "X-RateLimit-Remaining", Value: "99"},
			},
		}, true},
		{"over the limit, several statuses, multiplier, unknown enums", &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				status(rlsv3.RateLimitResponse_OVER_LIMIT, "", 100, rlsv3.RateLimitResponse_RateLimit_MINUTE, wrapperspb.UInt32(5), 0, durationpb.New(3*time.Minute)),
				{Code: rlsv3.RateLimitResponse_OK},
				{},
				status(rlsv3.RateLimitResponse_Code(7), "odd", math.MaxUint32, rlsv3.RateLimitResponse_RateLimit_Unit(42), wrapperspb.UInt32(0), math.MaxUint32, &durationpb.Duration{}),
			},
		}, true},
		{"durations", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{DurationUntilReset: durationpb.New(1500 * time.Millisecond)},
			{DurationUntilReset: durationpb.New(1500 * time.Microsecond)},
			{DurationUntilReset: durationpb.New(1)},
			{DurationUntilReset: durationpb.New(-2500 * time.Millisecond)},
			{DurationUntilReset: &durationpb.Duration{Seconds: 315576000000, Nanos: 999999999}},
		}}, true},
		{"strings that need escaping", &rlsv3.RateLimitResponse{
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(rlsv3.RateLimitResponse_OK, "a\"b\\c\n\t\x01\x7f<&>ü\u2028", 1, 1, nil, 0, nil)},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "", Value: "\r\b\f"}, {Key: "k"}},
		}, true},
		{"invalid UTF-8 falls back", &rlsv3.RateLimitResponse{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: "\xff"}}}, false},
		{"out of range duration falls back", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{DurationUntilReset: &durationpb.Duration{Seconds: 1, Nanos: -1}}}}, false},
		{"other fields fall back", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, RawBody: []byte("no"), DynamicMetadata: &structpb.Struct{}}, false},
		{"quota falls back", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := appendResponse(nil, tt.resp)
			if ok != tt.fast {
				t.Fatalf("fast encoder took it: %v, want %v", ok, tt.fast)
			}
			if !ok {
				return
			}
			if want := protojsonCompact(t, tt.resp); !bytes.Equal(got, want) {
				t.Errorf("appendResponse:\n%s\nprotojson:\n%s", got, want)
			}
		})
	}
}

// FuzzAppendResponse checks the fast encoder against protojson on
// responses built from fuzzed fields.
func FuzzAppendResponse(f *testing.F) {
	f.Add(int32(1), "per-user", uint32(30), int32(1), uint32(0), uint32(99), int64(0), int32(33334000), "RateLimit", `"per-user";r=99;t=1`)
	f.Add(int32(2), "", uint32(0), int32(0), uint32(5), uint32(0), int64(-3), int32(-5), "", "")
	f.Add(int32(9), "\x00\"\\\xff", uint32(1<<31), int32(99), uint32(1), uint32(1), int64(1<<40), int32(1e9), "\n", "\u2028")
	f.Fuzz(func(t *testing.T, code int32, name string, rate uint32, unit int32, mult uint32, remaining uint32, secs int64, nanos int32, hk, hv string) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_Code(code),
			LimitRemaining:     remaining,
			DurationUntilReset: &durationpb.Duration{Seconds: secs, Nanos: nanos},
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rate, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)},
		}
		if mult > 0 {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult - 1)
		}
		resp := &rlsv3.RateLimitResponse{
			OverallCode:          rlsv3.RateLimitResponse_Code(code),
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st, {}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: hk, Value: hv}},
		}
		got, ok := appendResponse(nil, resp)
		js, err := protojson.Marshal(resp)
		if !ok {
			if err == nil {
				t.Fatalf("fast encoder refused what protojson encodes: %s", js)
			}
			return
		}
		if err != nil {
			t.Fatalf("fast encoder took what protojson refuses (%v): %s", err, got)
		}
		if want := protojsonCompact(t, resp); !bytes.Equal(got, want) {
			t.Fatalf("appendResponse:\n%s\nprotojson:\n%s", got, want)
		}
	})
}

func BenchmarkEncodeResponse(b *testing.B) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 99, DurationUntilReset: durationpb.New(33334 * time.Microsecond),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per-user", RequestsPerUnit: 30, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{
			{Key: "RateLimit-Policy", Value: `"per-user";q=30;w=1`}, {Key: "RateLimit", Value: `"per-user";r=99;t=1`},
			{Key: "X-RateLimit-Limit", Value: "30"}, {Key: "X-RateLimit-Remaining", Value: "99"}, {Key: "X-RateLimit-Reset", Value: "1"},
		},
	}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = appendResponse(buf[:0], resp)
		}
	})
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			protojsonCompact(b, resp)
		}
	})
}

func TestDecodeFast(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		fast bool
	}{
		{"typical", aliceJSON, true},
		{"everything it knows", ` { "domain" : "api" , "hits_addend" : 3, "descriptors" : [ { "entries" : [ {"key":"a","value":"ü"}, {"key":"b"} ], "hitsAddend": 18446744073709551615, "is_negative_hits": false }, {} ] } `, true},
		{"empty object", `{}`, true},
		{"escapes go to protojson", `{"domain":"a\"pi"}`, false},
		{"string numbers go to protojson", `{"hitsAddend":"3"}`, false},
		{"null goes to protojson", `{"domain":null}`, false},
		{"limit override goes to protojson", `{"descriptors":[{"limit":{"requestsPerUnit":1}}]}`, false},
		{"duplicates go to protojson", `{"domain":"a","domain":"b"}`, false},
		{"both names go to protojson", `{"hitsAddend":1,"hits_addend":2}`, false},
		{"too large", `{"hitsAddend":4294967296}`, false},
		{"leading zero", `{"hitsAddend":01}`, false},
		{"exponent", `{"hitsAddend":1e2}`, false},
		{"trailing data", `{} {}`, false},
		{"unknown field", `{"bogus":1}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := decodeFast([]byte(tt.body))
			if ok != tt.fast {
				t.Fatalf("fast decoder took it: %v, want %v", ok, tt.fast)
			}
			if !ok {
				return
			}
			want := &rlsv3.RateLimitRequest{}
			if err := protojson.Unmarshal([]byte(tt.body), want); err != nil {
				t.Fatalf("protojson refuses what the fast decoder took: %v", err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("fast decoder: %v\nprotojson: %v", got, want)
			}
		})
	}
}

// FuzzDecodeFast checks that whatever the fast decoder accepts, protojson
// accepts with the same message.
func FuzzDecodeFast(f *testing.F) {
	f.Add([]byte(aliceJSON))
	f.Add([]byte(`{"domain":"api","hits_addend":3,"descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c"}],"hitsAddend":0,"isNegativeHits":true}]}`))
	f.Add([]byte(`{"hitsAddend":4294967295,"descriptors":[{"hits_addend":18446744073709551615}]}`))
	f.Add([]byte(` {"domain" : "\u00fc"} `))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := decodeFast(body)
		if !ok {
			return
		}
		want := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(body, want); err != nil {
			t.Fatalf("protojson refuses %q (%v); the fast decoder took it as %v", body, err, got)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("%q:\nfast decoder: %v\nprotojson: %v", body, got, want)
		}
	})
}

func BenchmarkDecodeRequest(b *testing.B) {
	body := []byte(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"user-1234"}]}]}`)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeFast(body); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := protojson.Unmarshal(body, &rlsv3.RateLimitRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
