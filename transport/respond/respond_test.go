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
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

// t0 is the start of a minute, so fixed windows of a minute start there.
var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// clock is the tests' fake clock, which they set by hand.
type clock = clocktest.Clock

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
			clk := clocktest.New(t0)
			svc := service(t, perUser, clk)
			w := respond.New(respond.Config{Headers: respond.AllHeaders, RetryJitter: 2 * time.Second, Rand: jitter.rand})
			req := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1}}}
			for _, p := range points {
				clk.Set(t0.Add(p.at))
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
			f := w.Fields(resp)
			v, ok := f.RetryAfter()
			s, err := strconv.ParseInt(v, 10, 64)
			if !ok || err != nil || s < 1 || time.Duration(s)*time.Second < d || time.Duration(s-1)*time.Second > d+time.Second {
				t.Fatalf("RetryAfter(%v) = %q, %v: want at least 1 s, not before %v, at most 1 s jitter", d, v, ok, d)
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

// TestOneRetryPerResponse: the jitter is drawn once per response, and the
// header and the body carry that one number, even when every draw differs.
func TestOneRetryPerResponse(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	draws := int64(0)
	next := func(n int64) int64 { // 0, 1, 2, ... modulo n: no two draws in a row agree
		mu.Lock()
		defer mu.Unlock()
		draws++
		return draws % n
	}
	w := respond.New(respond.Config{RetryJitter: 5 * time.Second, Rand: next})
	resp := &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{{Code: decide.OverLimit,
		Limit: &rules.Limit{ID: "l", Limit: sluice.Limit{Rate: 5, Period: time.Minute}}, Decision: sluice.Decision{Limit: 5, ResetAfter: 34 * time.Second, RetryAfter: 34 * time.Second}}}}
	for i := range 5 {
		rec := httptest.NewRecorder()
		w.Deny(rec, resp)
		ra := rec.Header().Get("Retry-After")
		if body := `{"error":"rate limited","retry_after":` + ra + "}\n"; ra == "" || rec.Body.String() != body {
			t.Fatalf("response %d: Retry-After %q, body %q", i, ra, rec.Body)
		}
		if s, _ := strconv.Atoi(ra); s < 34 || s > 39 {
			t.Fatalf("response %d: Retry-After %d, want 34..39", i, s)
		}
	}
	if draws != 5 {
		t.Fatalf("%d draws for 5 responses, want 5", draws)
	}
}

// TestBucketFields: a token bucket of 30 a second holding 100 advertises
// its burst as the quota, refilled in 4 s (100/30 rounded up), and the
// remaining never exceeds the quota, over a real decision service.
func TestBucketFields(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	svc := service(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: second, requests_per_unit: 30, algorithm: token_bucket, burst: 100}
`, clk)
	w := respond.New(respond.Config{RetryJitter: -1})
	req := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "alice"}}, Cost: 1}}}
	steps := []struct {
		at       time.Duration
		requests int
		policy   string
		state    string
		xlimit   string
		retry    string
	}{
		{0, 5, `"per-user";q=100;w=4`, `"per-user";r=95;t=1`, "100", ""},
		{0, 95, `"per-user";q=100;w=4`, `"per-user";r=0;t=4`, "100", ""},
		// Over the limit: t is the time until one token is back (34 ms,
		// rounded up), and Retry-After is no earlier.
		{0, 1, `"per-user";q=100;w=4`, `"per-user";r=0;t=1`, "100", "1"},
		{2 * time.Second, 1, `"per-user";q=100;w=4`, `"per-user";r=59;t=2`, "100", ""},
	}
	for _, s := range steps {
		clk.Set(t0.Add(s.at))
		var rec *httptest.ResponseRecorder
		for range s.requests {
			resp, err := svc.Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			rec = httptest.NewRecorder()
			w.Write(rec, resp)
		}
		h := rec.Header()
		if h.Get("RateLimit-Policy") != s.policy || h.Get("RateLimit") != s.state || h.Get("X-RateLimit-Limit") != s.xlimit || h.Get("Retry-After") != s.retry {
			t.Errorf("+%v: RateLimit-Policy %q RateLimit %q X-RateLimit-Limit %q Retry-After %q; want %q %q %q %q", s.at,
				h.Get("RateLimit-Policy"), h.Get("RateLimit"), h.Get("X-RateLimit-Limit"), h.Get("Retry-After"), s.policy, s.state, s.xlimit, s.retry)
		}
	}
}

func TestNoEnforcedLimitNoFields(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	respond.New(respond.Config{}).SetHeaders(h, &decide.Response{Overall: decide.OK, Statuses: []decide.Status{{Code: decide.OK}}})
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
	w := respond.New(respond.Config{})
	b.ReportAllocs()
	for b.Loop() {
		w.SetHeaders(make(http.Header, 8), resp)
	}
}
