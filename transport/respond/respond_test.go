package respond_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

// t0 is the start of a minute, so fixed windows of a minute start there.
var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(d time.Duration) { c.mu.Lock(); c.now = t0.Add(d); c.mu.Unlock() }

// service returns the real decision service over the memory store, on clk.
func service(t *testing.T, rulesYAML string, clk *clock) *decide.Service {
	return testenv.Decider(t, rulesYAML, clk.Now)
}

const perUser = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 10}
`

// TestWindow follows one fixed window of 10 per minute and checks every
// field at each point of it, with the smallest and the largest jitter.
func TestWindow(t *testing.T) {
	t.Parallel()
	type point struct {
		at       time.Duration
		requests int // sent at this point; the last one is checked
		status   int
		policy   string
		state    string
		xlimit   string
		xremain  string
		xreset   string
		retryMin int64 // Retry-After without jitter; 0 when allowed
	}
	points := []point{
		{0, 1, 200, `"per-user";q=10;w=60`, `"per-user";r=9;t=60`, "10", "9", "60", 0},
		{15 * time.Second, 8, 200, `"per-user";q=10;w=60`, `"per-user";r=1;t=45`, "10", "1", "45", 0},
		{15*time.Second + 300*time.Millisecond, 1, 200, `"per-user";q=10;w=60`, `"per-user";r=0;t=45`, "10", "0", "45", 0},
		{30 * time.Second, 1, 429, `"per-user";q=10;w=60`, `"per-user";r=0;t=30`, "10", "0", "30", 30},
		{59*time.Second + 500*time.Millisecond, 1, 429, `"per-user";q=10;w=60`, `"per-user";r=0;t=1`, "10", "0", "1", 1},
		{60 * time.Second, 1, 200, `"per-user";q=10;w=60`, `"per-user";r=9;t=60`, "10", "9", "60", 0},
	}
	for _, jitter := range []struct {
		name string
		rand func(int64) int64
		add  int64
	}{
		{"no jitter drawn", func(int64) int64 { return 0 }, 0},
		{"largest jitter drawn", func(n int64) int64 { return n - 1 }, 2},
	} {
		t.Run(jitter.name, func(t *testing.T) {
			t.Parallel()
			clk := &clock{now: t0}
			svc := service(t, perUser, clk)
			w := respond.New(respond.Config{Mode: respond.Both, RetryJitter: 2 * time.Second, Rand: jitter.rand})
			req := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1}}}
			for _, p := range points {
				clk.Set(p.at)
				var rec *httptest.ResponseRecorder
				for range p.requests {
					resp, err := svc.Decide(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					rec = httptest.NewRecorder()
					if w.Write(rec, resp) {
						rec.WriteHeader(http.StatusOK)
					}
				}
				h := rec.Header()
				if rec.Code != p.status {
					t.Fatalf("+%v: status %d, want %d", p.at, rec.Code, p.status)
				}
				for _, f := range []struct{ name, want string }{
					{"RateLimit-Policy", p.policy}, {"RateLimit", p.state},
					{"X-RateLimit-Limit", p.xlimit}, {"X-RateLimit-Remaining", p.xremain}, {"X-RateLimit-Reset", p.xreset},
				} {
					if got := h.Get(f.name); got != f.want {
						t.Errorf("+%v: %s = %q, want %q", p.at, f.name, got, f.want)
					}
				}
				ra := h.Get("Retry-After")
				if p.retryMin == 0 {
					if ra != "" || rec.Body.Len() != 0 {
						t.Errorf("+%v: allowed response has Retry-After %q, body %q", p.at, ra, rec.Body)
					}
					continue
				}
				want := p.retryMin + jitter.add
				if ra != strconv.FormatInt(want, 10) {
					t.Errorf("+%v: Retry-After %q, want %d", p.at, ra, want)
				}
				if body := `{"error":"rate limited","retry_after":` + ra + "}\n"; rec.Body.String() != body {
					t.Errorf("+%v: body %q, want %q", p.at, rec.Body, body)
				}
				if ct := h.Get("Content-Type"); ct != "application/json" {
					t.Errorf("+%v: Content-Type %q", p.at, ct)
				}
			}
		})
	}
}

func TestRetryAfterNeverZeroNorEarly(t *testing.T) {
	t.Parallel()
	w := respond.New(respond.Config{RetryJitter: time.Second})
	for _, d := range []time.Duration{0, time.Microsecond, 999 * time.Millisecond, time.Second, time.Second + 1, 90 * time.Minute} {
		resp := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{{Code: decide.OverLimit, Decision: sluice.Decision{RetryAfter: d}}}}
		for range 50 {
			s, ok := w.RetryAfter(resp)
			if !ok || s < 1 || time.Duration(s)*time.Second < d || time.Duration(s-1)*time.Second > d+time.Second {
				t.Fatalf("RetryAfter(%v) = %d, %v: want at least 1 s, not before %v, at most 1 s jitter", d, s, ok, d)
			}
		}
	}
	never := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{{Code: decide.OverLimit, Decision: sluice.Decision{RetryAfter: sluice.Never}}}}
	rec := httptest.NewRecorder()
	w.Deny(rec, never)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "" || rec.Body.String() != `{"error":"rate limited"}`+"\n" {
		t.Fatalf("cost above the limit: %d %q %q", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

func TestModes(t *testing.T) {
	t.Parallel()
	ip := &rules.Limit{ID: "a1b2", Limit: sluice.Limit{Rate: 100, Period: time.Second}}
	user := &rules.Limit{Name: `we"ird`, Limit: sluice.Limit{Rate: 5, Period: time.Minute}}
	resp := &decide.Response{Overall: decide.OK, Statuses: []decide.Status{
		{Code: decide.OK, Limit: ip, Decision: sluice.Decision{Allowed: true, Limit: 100, Remaining: 40, ResetAfter: 300 * time.Millisecond}},
		{Code: decide.OK, Limit: user, Decision: sluice.Decision{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 20 * time.Second}},
		{Code: decide.OK}, // no rule matched
		{Code: decide.OK, Limit: ip, Shadow: true, ShadowOverLimit: true},
	}}
	both := map[string]string{
		"RateLimit-Policy":      `"a1b2";q=100;w=1, "we\"ird";q=5;w=60`,
		"RateLimit":             `"a1b2";r=40;t=1, "we\"ird";r=2;t=20`,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "2",
		"X-RateLimit-Reset":     "20",
	}
	only := func(names ...string) map[string]string {
		m := map[string]string{}
		for k := range both {
			m[k] = ""
		}
		for _, n := range names {
			m[n] = both[n]
		}
		return m
	}
	tests := []struct {
		name string
		mode string
		want map[string]string
	}{
		{"both", "both", both},
		{"ietf", "ietf", only("RateLimit-Policy", "RateLimit")},
		{"x-ratelimit", "X-RateLimit", only("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")},
		{"none", "none", only()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := respond.ParseMode(tt.mode)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			respond.New(respond.Config{Mode: m}).SetHeaders(h, resp)
			for k, v := range tt.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	for _, a := range []struct {
		s    string
		want respond.Mode
	}{{"all", respond.Both}, {"RateLimit", respond.IETF}, {"x-ratelimit", respond.XRateLimit}} {
		if m, err := respond.ParseMode(a.s); err != nil || m != a.want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", a.s, m, err, a.want)
		}
	}
	if _, err := respond.ParseMode("retry-after"); err == nil {
		t.Fatal("ParseMode(retry-after) succeeded")
	}
}

func TestNoEnforcedLimitNoFields(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	respond.New(respond.DefaultConfig()).SetHeaders(h, &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{Code: decide.OK}}})
	if len(h) != 0 {
		t.Fatalf("headers %v, want none", h)
	}
}

// BenchmarkSetHeaders sets the fields of one enforced limit, as the proxy
// does for every allowed request.
func BenchmarkSetHeaders(b *testing.B) {
	svc := testenv.Decider(b, perUser, nil)
	resp, err := svc.Decide(context.Background(), &decide.Request{Domain: "api",
		Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1}}})
	if err != nil {
		b.Fatal(err)
	}
	w := respond.New(respond.DefaultConfig())
	b.ReportAllocs()
	for b.Loop() {
		w.SetHeaders(make(http.Header, 8), resp)
	}
}
