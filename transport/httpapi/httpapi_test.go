package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/envoyrls"
	"github.com/sluicehq/sluice/transport/respond"
)

// fakeDecider admits the first two hits of each user and denies the rest,
// as a fixed window of 2 per minute would.
type fakeDecider struct {
	used atomic.Int64
}

var perUser = &rules.Limit{
	Name: "per-user", ID: "0123456789abcdef", Unit: "minute", UnitMultiplier: 1,
	Limit: sluice.Limit{Rate: 2, Period: time.Minute},
}

func (f *fakeDecider) Decide(_ context.Context, req *decide.Request) (*decide.Response, error) {
	if len(req.Descriptors) == 0 {
		return nil, errors.New("invalid request: no descriptors")
	}
	for i, d := range req.Descriptors {
		for j, e := range d.Entries {
			if e.Key == "" {
				return nil, fmt.Errorf("invalid request: descriptor %d: entry %d: empty key", i, j)
			}
		}
	}
	resp := &decide.Response{Overall: decide.OK}
	for _, d := range req.Descriptors {
		st := decide.Status{Code: decide.OK, Limit: perUser}
		n := f.used.Add(d.Cost)
		if n > 2 {
			f.used.Add(-d.Cost)
			st.Code, resp.Overall = decide.OverLimit, decide.OverLimit
			st.Decision = sluice.Decision{Limit: 2, ResetAfter: 30 * time.Second, RetryAfter: 30 * time.Second}
		} else {
			st.Decision = sluice.Decision{Allowed: true, Limit: 2, Remaining: 2 - n, ResetAfter: 30 * time.Second}
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

const rulesYAML = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
`

// newServer starts the API over a fakeDecider on a loopback port.
func newServer(t *testing.T, loaded bool) (*httptest.Server, *Handler, *prometheus.Registry) {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	calls := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_calls_total", Help: "Calls."})
	reg.MustRegister(calls)
	calls.Inc()
	cfg := DefaultConfig()
	cfg.RateLimiter = envoyrls.New(&fakeDecider{}, envoyrls.Config{Respond: respond.New(respond.Config{RetryJitter: -1})})
	cfg.Rules = func() *rules.Set {
		if !loaded {
			return nil
		}
		return set
	}
	cfg.Ops.Mode = func() string { return "store" }
	cfg.Ops.Gatherer = reg
	cfg.MaxBodyBytes = 4096
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, h, reg
}

type result struct {
	code   int
	header http.Header
	body   string
}

func do(t *testing.T, method, url, body string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{resp.StatusCode, resp.Header, string(b)}
}

const aliceJSON = `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`

func TestDecide(t *testing.T) {
	t.Parallel()
	srv, _, _ := newServer(t, true)
	tests := []struct {
		name     string
		path     string
		body     string
		code     int
		contains []string
		header   map[string]string
	}{
		{
			name: "first hit", path: "/v1/decide", body: aliceJSON, code: 200,
			contains: []string{`"overallCode":"OK"`, `"limitRemaining":1`, `"requestsPerUnit":2`, `"unit":"MINUTE"`, `"name":"per-user"`, `"durationUntilReset":"30s"`},
			header:   map[string]string{"X-RateLimit-Remaining": "1", "RateLimit-Policy": `"per-user";q=2;w=60`, "Content-Type": "application/json"},
		},
		{
			name: "second hit via /json", path: "/json", body: aliceJSON, code: 200,
			contains: []string{`"overallCode":"OK"`},
			header:   map[string]string{"X-RateLimit-Remaining": "0", "RateLimit": `"per-user";r=0;t=30`},
		},
		{
			name: "over the limit is 200 on /v1/decide", path: "/v1/decide", body: aliceJSON, code: 200,
			contains: []string{`"overallCode":"OVER_LIMIT"`, `"code":"OVER_LIMIT"`, `"key":"Retry-After"`},
		},
		{
			name: "over the limit is 429 on /json", path: "/json", body: aliceJSON, code: 429,
			contains: []string{`"overallCode":"OVER_LIMIT"`},
			header:   map[string]string{"Retry-After": "30"},
		},
		{
			name: "malformed JSON", path: "/v1/decide", body: `{"domain":`, code: 400,
			contains: []string{`"error":"decode RateLimitRequest`},
		},
		{
			name: "unknown field", path: "/v1/decide", body: `{"domain":"api","bogus":1}`, code: 400,
			contains: []string{`bogus`},
		},
		{
			name: "no descriptors", path: "/json", body: `{"domain":"api"}`, code: 400,
			contains: []string{`"error":"invalid request: no descriptors"`},
		},
		{
			name: "empty key", path: "/v1/decide", body: `{"domain":"api","descriptors":[{"entries":[{"key":"","value":"x"}]}]}`, code: 400,
			contains: []string{`"error":"invalid request: descriptor 0: entry 0: empty key"`},
		},
		{
			name: "body too large", path: "/v1/decide", body: `{"domain":"` + strings.Repeat("a", 5000) + `"}`, code: 413,
			contains: []string{`body larger than 4096 bytes`},
		},
	}
	// The cases run in order: the fake counts hits across them.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, "POST", srv.URL+tt.path, tt.body)
			if r.code != tt.code {
				t.Fatalf("status %d, want %d; body %s", r.code, tt.code, r.body)
			}
			for _, s := range tt.contains {
				if !strings.Contains(r.body, s) {
					t.Errorf("body %s does not contain %s", r.body, s)
				}
			}
			for k, v := range tt.header {
				if got := r.header.Get(k); got != v {
					t.Errorf("header %s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

// TestJSONRetryAfterAgrees: the Retry-After of a 429 from /json is the one
// in its body's responseHeadersToAdd, with a jitter whose every draw
// differs, and no earlier than the reset the body states.
func TestJSONRetryAfterAgrees(t *testing.T) {
	t.Parallel()
	var draws atomic.Int64
	w := respond.New(respond.Config{RetryJitter: 5 * time.Second, Rand: func(n int64) int64 { return draws.Add(1) % n }})
	cfg := DefaultConfig()
	cfg.RateLimiter = envoyrls.New(&fakeDecider{}, envoyrls.Config{Respond: w})
	cfg.Rules = func() *rules.Set { return nil }
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for i := range 2 {
		if r := do(t, "POST", srv.URL+"/json", aliceJSON); r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
	}
	for i := range 3 {
		r := do(t, "POST", srv.URL+"/json", aliceJSON)
		var body struct {
			Statuses []struct {
				DurationUntilReset string `json:"durationUntilReset"`
			} `json:"statuses"`
			ResponseHeadersToAdd []struct{ Key, Value string } `json:"responseHeadersToAdd"`
		}
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.code != 429 || len(body.Statuses) != 1 {
			t.Fatalf("denial %d: %d %s (%v)", i, r.code, r.body, err)
		}
		inBody := ""
		for _, kv := range body.ResponseHeadersToAdd {
			if kv.Key == "Retry-After" {
				inBody = kv.Value
			}
		}
		header := r.header.Get("Retry-After")
		reset, err := time.ParseDuration(body.Statuses[0].DurationUntilReset)
		secs, _ := strconv.ParseInt(header, 10, 64)
		if header == "" || header != inBody || err != nil || time.Duration(secs)*time.Second < reset {
			t.Fatalf("denial %d: Retry-After %q, in the body %q, reset %q", i, header, inBody, body.Statuses[0].DurationUntilReset)
		}
	}
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	srv, h, _ := newServer(t, true)
	idle, _, _ := newServer(t, false)
	if err := h.Handle("GET /v1/auth", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})); err != nil {
		t.Fatal(err)
	}
	if err := h.Handle("GET /v1/auth", http.NotFoundHandler()); err == nil {
		t.Error("mounting /v1/auth twice: no error")
	}
	tests := []struct {
		name     string
		method   string
		url      string
		code     int
		contains string
	}{
		{"healthz", "GET", srv.URL + "/healthz", 200, `"status":"ok"`},
		{"readyz", "GET", srv.URL + "/readyz", 200, `"mode":"store"`},
		{"readyz before rules", "GET", idle.URL + "/readyz", 503, `rules not loaded`},
		{"healthcheck", "GET", srv.URL + "/healthcheck", 200, "OK"},
		{"healthcheck before rules", "GET", idle.URL + "/healthcheck", 500, ""},
		{"rules", "GET", srv.URL + "/v1/rules", 200, `"per-user"`},
		{"rules before rules", "GET", idle.URL + "/v1/rules", 503, `rules not loaded`},
		{"metrics", "GET", srv.URL + "/metrics", 200, "test_calls_total 1"},
		{"mounted handler", "GET", srv.URL + "/v1/auth", 204, ""},
		{"wrong method on decide", "GET", srv.URL + "/v1/decide", 405, ""},
		{"wrong method on json", "PUT", srv.URL + "/json", 405, ""},
		{"wrong method on healthz", "POST", srv.URL + "/healthz", 405, ""},
		{"unknown path", "GET", srv.URL + "/nope", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := do(t, tt.method, tt.url, "")
			if r.code != tt.code {
				t.Fatalf("status %d, want %d; body %s", r.code, tt.code, r.body)
			}
			if !strings.Contains(r.body, tt.contains) {
				t.Errorf("body %s does not contain %s", r.body, tt.contains)
			}
		})
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	srv, h, _ := newServer(t, true)
	h.Drain()
	r := do(t, "GET", srv.URL+"/readyz", "")
	var body map[string]string
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatal(err)
	}
	if r.code != 503 || body["status"] != "draining" {
		t.Errorf("readyz while draining: %d %v, want 503 draining", r.code, body)
	}
	if r := do(t, "GET", srv.URL+"/healthcheck", ""); r.code != 500 {
		t.Errorf("healthcheck while draining: %d, want 500 as Envoy's ratelimit answers", r.code)
	}
	if r := do(t, "POST", srv.URL+"/v1/decide", aliceJSON); r.code != 200 {
		t.Errorf("decide while draining: %d, want 200", r.code)
	}
}

// TestSlowBody trickles request bodies to a real server whose BodyTimeout
// is short: on the decision API, which reads the body, and on a mounted
// route that does not (as forward-auth), the server gives up on the body
// and closes the connection within the bound instead of holding it.
func TestSlowBody(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.RateLimiter = envoyrls.New(&fakeDecider{}, envoyrls.Config{})
	cfg.Rules = func() *rules.Set { return nil }
	cfg.BodyTimeout = 200 * time.Millisecond
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Handle("GET /v1/auth", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, tt := range []struct{ name, request string }{
		{"decision API", "POST /v1/decide HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\""},
		{"a route that does not read the body", "GET /v1/auth HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			// The rest of the body never comes. Wait for the server to
			// close the connection; the guard is far past the bound.
			start := time.Now()
			if err := conn.SetReadDeadline(start.Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(conn)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection still open after %v; read %q", time.Since(start), got)
			}
		})
	}
}

func TestNewRequiresParts(t *testing.T) {
	t.Parallel()
	if _, err := New(DefaultConfig()); err == nil {
		t.Error("New without RateLimiter and Rules: no error")
	}
}

func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(aliceJSON))
	f.Add([]byte(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}],"hitsAddend":0}],"hitsAddend":3}`))
	f.Add([]byte(`{"domain":"api","descriptors":[{"entries":[{"key":"a"},{"key":"b","value":"c"}],"isNegativeHits":true}]}`))
	f.Add([]byte(`{"domain":"","descriptors":[]}`))
	f.Add([]byte(`{"hitsAddend":"4294967296"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"domain":"\u0000"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeRequest(body)
		if err != nil {
			if req != nil {
				t.Fatalf("decodeRequest returned a request and error %v", err)
			}
			return
		}
		dr, err := envoyrls.Decode(req)
		if err != nil {
			return
		}
		if dr.Domain != req.Domain || len(dr.Descriptors) != len(req.Descriptors) {
			t.Fatalf("Decode(%s) = %+v: lost the domain or descriptors", body, dr)
		}
		for i, d := range dr.Descriptors {
			if len(d.Entries) != len(req.Descriptors[i].GetEntries()) || d.Cost < 0 || d.Cost > 1<<32-1 {
				t.Fatalf("descriptor %d of %s: %+v", i, body, d)
			}
			for j, e := range d.Entries {
				if want := req.Descriptors[i].Entries[j]; e.Key != want.GetKey() || e.Value != want.GetValue() {
					t.Fatalf("descriptor %d entry %d of %s: %+v, want %v", i, j, body, e, want)
				}
			}
		}
	})
}
