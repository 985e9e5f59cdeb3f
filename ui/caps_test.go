package ui_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/ui"
)

// worstRules and worstTraffic ask for the most the dashboard's caps allow:
// 8 limits (two sliding_log ones, whose logs hold every hit) over 50,000
// requests from 1,000 clients in an hour.
const worstRules = "domain: api\ndescriptors:\n" +
	"  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: sliding_log}\n" +
	"  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"

var worstBody, _ = json.Marshal(map[string]any{"rules": worstRules, "traffic": "clients 1000; burst 25000; idle 1s; burst 25000; idle 59m58s",
	"algorithms": []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket"}})

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWebCapsCost: the costliest simulation the dashboard accepts
// allocates a few MB (before its caps, one of 1,000,000 requests, 10,000
// clients and 24 limits over a day allocated 349 MB, used 3.2 s of CPU
// and answered 9.9 MB); asking for more is refused at once.
func TestWebCapsCost(t *testing.T) {
	h := newHandler(t)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	alloc, cpu := ms.TotalAlloc, cpuTime()
	w := post(h, string(worstBody))
	runtime.ReadMemStats(&ms)
	alloc, cpu = ms.TotalAlloc-alloc, cpuTime()-cpu
	var res struct {
		Requests int               `json:"requests"`
		Series   []json.RawMessage `json:"series"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); w.Code != 200 || err != nil || res.Requests != 50_000 || len(res.Series) != 8 {
		t.Fatalf("%d %.200s", w.Code, w.Body)
	}
	t.Logf("allocated %d bytes, %v of CPU, answered %d bytes", alloc, cpu, w.Body.Len())
	if alloc > 24<<20 {
		t.Errorf("allocated %d bytes", alloc)
	}
	for _, tc := range []struct{ traffic, algs, want string }{
		{"burst 50001", "", "from 1 to 50000"}, {"burst 30000; burst 30000", "", "more than 50000 requests"},
		{"clients 1001; burst 1", "", "at most 1000 clients"},
		{"idle 1h1s; burst 1", "", "more than 1h0m0s"},
		{"burst 1", `"fixed_window","sliding_window","sliding_log","token_bucket","leaky_bucket"`, "more than 8 limits"},
	} {
		body := `{"rules":` + string(mustJSON(worstRules)) + `,"traffic":"` + tc.traffic + `","algorithms":[` + tc.algs + `]}`
		if w := post(h, body); w.Code != 400 || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("%s %s: %d %.200s, want 400 with %q", tc.traffic, tc.algs, w.Code, w.Body, tc.want)
		}
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

// BenchmarkWebCapsWorst runs the costliest simulation the dashboard
// accepts.
func BenchmarkWebCapsWorst(b *testing.B) {
	h := newHandler(b)
	b.ReportAllocs()
	for b.Loop() {
		if w := post(h, string(worstBody)); w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}

// TestOneSimulationAtATime: a simulation asked for while one runs is
// answered 429 with Retry-After, and runs once the first is done.
func TestOneSimulationAtATime(t *testing.T) {
	h := newHandler(t)
	body := `{"rules":` + string(mustJSON(worstRules)) + `,"traffic":"burst 1"}`
	release := h.Hold()
	if w := post(h, body); w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("beside a running simulation: %d %s", w.Code, w.Body)
	}
	release()
	if w := post(h, body); w.Code != 200 {
		t.Fatalf("after it: %d %s", w.Code, w.Body)
	}
}

// TestAuthenticate: with Authenticate every route, and what Guard wraps,
// asks for a token: Basic's password (any user) or a bearer token.
func TestAuthenticate(t *testing.T) {
	set, _ := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"))
	h, err := ui.New(ui.Config{Rules: func() *rules.Set { return set }, Gatherer: prometheus.NewRegistry(),
		Authenticate: func(s string) bool { return s == "the-secret-0123456789" }})
	if err != nil {
		t.Fatal(err)
	}
	top := h.Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("top")) }))
	for _, path := range []string{"/ui/", "/ui/api/stats", "/ui/static/app.js", "/ui/simulate", "/v1/top"} {
		for _, c := range []struct {
			name string
			set  func(r *http.Request)
			code int
		}{
			{"none", func(*http.Request) {}, 401},
			{"wrong", func(r *http.Request) { r.SetBasicAuth("x", "wrong") }, 401},
			{"basic", func(r *http.Request) { r.SetBasicAuth("anyone", "the-secret-0123456789") }, 200},
			{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer the-secret-0123456789") }, 200},
		} {
			r := httptest.NewRequest("GET", path, nil)
			c.set(r)
			w := httptest.NewRecorder()
			if path == "/v1/top" {
				top.ServeHTTP(w, r)
			} else {
				h.ServeHTTP(w, r)
			}
			if w.Code != c.code || c.code == 401 && !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("%s, %s: %d %v", path, c.name, w.Code, w.Header())
			}
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/ui/api/simulate", strings.NewReader(`{"traffic":"burst 1"}`)))
	if w.Code != 401 {
		t.Fatalf("a simulation without a token: %d", w.Code)
	}
}
