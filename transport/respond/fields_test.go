package respond_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

func limit(name, id, unit string, mult, rate int64, period time.Duration) *rules.Limit {
	return &rules.Limit{
		Name: name, ID: id, Unit: unit, UnitMultiplier: mult,
		Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: rate, Period: period},
	}
}

// fields returns the fields w computes for resp as name/value pairs.
func fields(w *respond.Writer, resp *decide.Response) [][2]string {
	f := w.Fields(resp)
	var out [][2]string
	for i := range f.Len() {
		n, v := f.Field(i)
		out = append(out, [2]string{n, v})
	}
	return out
}

// TestZeroHeadersIsAll: a zero Config sends every field, and Headers
// zero is AllHeaders.
func TestZeroHeadersIsAll(t *testing.T) {
	t.Parallel()
	resp := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{
		{Code: decide.OverLimit, Limit: limit("l", "l", "second", 1, 1, time.Second), Decision: sluice.Decision{Limit: 1, ResetAfter: time.Second, RetryAfter: time.Second}},
	}}
	h := http.Header{}
	respond.New(respond.Config{}).SetHeaders(h, resp)
	for _, name := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		if h.Get(name) == "" {
			t.Errorf("zero Config: no %s in %v", name, h)
		}
	}
	if s := respond.Headers(0).String(); s != "all" {
		t.Errorf("Headers(0) = %q, want all", s)
	}
}

func TestFields(t *testing.T) {
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
		headers respond.Headers
		want    [][2]string
	}{
		{
			name: "all headers, two limits, shadow and unmatched left out", resp: twoLimits, headers: respond.AllHeaders,
			want: [][2]string{
				{"RateLimit-Policy", `"per-user";q=100;w=60, "api/ip";q=10;w=1`},
				{"RateLimit", `"per-user";r=40;t=12, "api/ip";r=3;t=1`},
				{"X-RateLimit-Limit", "10"},
				{"X-RateLimit-Remaining", "3"},
				{"X-RateLimit-Reset", "1"},
			},
		},
		{
			name: "only the draft's fields", resp: twoLimits, headers: respond.HeaderRateLimit,
			want: [][2]string{
				{"RateLimit-Policy", `"per-user";q=100;w=60, "api/ip";q=10;w=1`},
				{"RateLimit", `"per-user";r=40;t=12, "api/ip";r=3;t=1`},
			},
		},
		{
			name: "denied gets Retry-After rounded up", resp: denied, headers: respond.HeaderXRateLimit | respond.HeaderRetryAfter,
			want: [][2]string{
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "0"},
				{"X-RateLimit-Reset", "3"},
				{"Retry-After", "3"},
			},
		},
		{
			name: "the denying limit binds before the one with fewer remaining", resp: overBeatsFewer, headers: respond.HeaderXRateLimit,
			want: [][2]string{
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "5"},
				{"X-RateLimit-Reset", "20"},
			},
		},
		{
			name: "no Retry-After when waiting never helps", resp: never, headers: respond.HeaderRetryAfter,
			want: nil,
		},
		{
			name: "none", resp: denied, headers: respond.NoHeaders,
			want: nil,
		},
		{
			name: "no enforced limit, no headers", resp: &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{Code: decide.OK}}}, headers: respond.AllHeaders,
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := fields(respond.New(respond.Config{Headers: tt.headers, RetryJitter: -1}), tt.resp)
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
	w := respond.New(respond.Config{Headers: respond.HeaderRetryAfter, RetryJitter: 3 * time.Second})
	for range 200 {
		h := fields(w, resp)
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
		want    respond.Headers
		wantErr bool
	}{
		{name: "all", in: "all", want: respond.AllHeaders},
		{name: "none", in: "none", want: respond.NoHeaders},
		{name: "empty", in: "", want: respond.NoHeaders},
		{name: "list", in: "ratelimit, Retry-After", want: respond.HeaderRateLimit | respond.HeaderRetryAfter},
		{name: "sluice serve's old default spelled out", in: "ratelimit,x-ratelimit,retry-after", want: respond.AllHeaders},
		{name: "the proxy's old word", in: "both", wantErr: true},
		{name: "unknown", in: "ratelimit,x-foo", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := respond.ParseHeaders(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseHeaders(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseHeaders(%q) = %v, want %v", tt.in, got, tt.want)
			}
			if !tt.wantErr {
				if back, err := respond.ParseHeaders(got.String()); err != nil || back != got {
					t.Errorf("ParseHeaders(%q) = %v, %v; want %v", got.String(), back, err, got)
				}
			}
		})
	}
}

func TestCanonicalKey(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After", "x-custom-header"} {
		if got, want := respond.CanonicalKey(k), http.CanonicalHeaderKey(k); got != want {
			t.Errorf("CanonicalKey(%q) = %q, want %q", k, got, want)
		}
	}
}

// FuzzParseHeaders: whatever ParseHeaders accepts reads back the same from
// its String, and what it refuses is refused with an error, not a panic.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{"all", "none", "", "ratelimit, Retry-After", "x-ratelimit,x-ratelimit", "both", ",", "RATELIMIT,none"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := respond.ParseHeaders(s)
		if err != nil {
			return
		}
		back, err := respond.ParseHeaders(h.String())
		if err != nil || back.String() != h.String() {
			t.Fatalf("ParseHeaders(%q) = %v; its String %q reads back as %v, %v", s, h, h.String(), back, err)
		}
	})
}

// FuzzFieldsAgree builds one enforced limit's decision from arbitrary
// numbers and checks that the fields of the response agree with each
// other: r never exceeds q, t never exceeds the retry a denial states,
// X-RateLimit-* repeat q, r and t, and Retry-After, the same in the header
// and as RetryAfter, is at least 1 and no earlier than t.
func FuzzFieldsAgree(f *testing.F) {
	f.Add(int64(30), int64(100), int64(1e9), int64(95), int64(170e6), int64(0), false, true)
	f.Add(int64(5), int64(0), int64(60e9), int64(0), int64(34e9), int64(34e9), true, false)
	f.Add(int64(10), int64(20), int64(1e9), int64(0), int64(2e9), int64(100e6), true, true)
	f.Fuzz(func(t *testing.T, rate, burst, period, remaining, reset, retry int64, denied, bucket bool) {
		if rate < 1 || rate > 1e9 || burst < 0 || burst > 1e9 || period < 1e6 || period > int64(366*24*time.Hour) ||
			reset < 0 || reset > period*2 || retry < 0 || retry > period*2 {
			return
		}
		l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: rate, Period: time.Duration(period)}
		if bucket {
			l.Algorithm, l.Burst = sluice.TokenBucket, burst
		}
		capacity := l.Capacity()
		remaining = min(max(remaining, 0), capacity)
		st := decide.Status{Code: decide.OK, Limit: &rules.Limit{Name: "l", Limit: l},
			Decision: sluice.Decision{Allowed: true, Limit: capacity, Remaining: remaining, ResetAfter: time.Duration(reset)}}
		overall := decide.OK
		if denied {
			st.Code, overall = decide.OverLimit, decide.OverLimit
			st.Decision.Allowed, st.Decision.RetryAfter = false, time.Duration(retry)
		}
		f := respond.New(respond.Config{RetryJitter: 2 * time.Second}).Fields(&decide.Response{Overall: overall, Statuses: []decide.Status{st}})
		got := map[string]string{}
		for i := range f.Len() {
			n, v := f.Field(i)
			got[n] = v
		}
		var q, w, r, tt int64
		if _, err := fmt.Sscanf(got["RateLimit-Policy"], `"l";q=%d;w=%d`, &q, &w); err != nil {
			t.Fatalf("RateLimit-Policy %q: %v", got["RateLimit-Policy"], err)
		}
		if _, err := fmt.Sscanf(got["RateLimit"], `"l";r=%d;t=%d`, &r, &tt); err != nil {
			t.Fatalf("RateLimit %q: %v", got["RateLimit"], err)
		}
		if q != capacity || w < 1 || r > q || r < 0 || tt < 0 {
			t.Fatalf("q=%d w=%d r=%d t=%d for capacity %d", q, w, r, tt, capacity)
		}
		if got["X-RateLimit-Limit"] != strconv.FormatInt(q, 10) || got["X-RateLimit-Remaining"] != strconv.FormatInt(r, 10) || got["X-RateLimit-Reset"] != strconv.FormatInt(tt, 10) {
			t.Fatalf("X-RateLimit-* %v disagree with q=%d r=%d t=%d", got, q, r, tt)
		}
		ra, ok := f.RetryAfter()
		if ok != denied || got["Retry-After"] != ra {
			t.Fatalf("Retry-After header %q, RetryAfter %q %v, denied %v", got["Retry-After"], ra, ok, denied)
		}
		if denied {
			s, err := strconv.ParseInt(ra, 10, 64)
			if err != nil || s < 1 || s < tt || time.Duration(s)*time.Second < time.Duration(retry) {
				t.Fatalf("Retry-After %q before t=%d or the retry %v", ra, tt, time.Duration(retry))
			}
		}
	})
}
