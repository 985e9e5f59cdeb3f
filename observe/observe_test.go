package observe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/sketch"
	"github.com/sluicehq/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: api
        value: send
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50, throttling: soft, exceed_percent: 10}
`

// stack is a decision service on a memory store watched by a Watcher, and
// one on the same store unwatched, all on one fake clock.
type stack struct {
	clk   *clocktest.Clock
	svc   *decide.Service // watched by obs
	plain *decide.Service // not watched
	obs   *observe.Watcher
	log   *bytes.Buffer
	srv   *httptest.Server
}

func newStack(t testing.TB, cfg observe.Config) *stack {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktest.New(t0)
	mc := memory.DefaultConfig()
	mc.Now = clk.Now
	mem, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store, dc.Now = mem, clk.Now
	dc.Logger = slog.New(slog.DiscardHandler)
	plain, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cfg.Now = clk.Now
	cfg.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	obs, err := observe.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { obs.Close() })
	dc.Observers = []decide.Observer{obs}
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/top", obs.TopHandler())
	mux.Handle("GET /v1/keys/", observe.KeysHandler(svc))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &stack{clk: clk, svc: svc, plain: plain, obs: obs, log: &buf, srv: srv}
}

func req(domain string, kv ...string) *decide.Request {
	var es []decide.Entry
	for i := 0; i < len(kv); i += 2 {
		es = append(es, decide.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &decide.Request{Domain: domain, Descriptors: []decide.Descriptor{{Entries: es, Cost: 1}}}
}

func (s *stack) decide(t testing.TB, r *decide.Request) *decide.Response {
	t.Helper()
	resp, err := s.svc.Decide(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func get(t testing.TB, url string, want int, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d, want %d", url, resp.StatusCode, want)
	}
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
}

type topBody struct {
	Counted    bool
	Total      uint64
	ErrorBound uint64 `json:"error_bound"`
	Clients    []struct {
		Value string
		Count uint64
	}
	Keys []observe.Key
}

// TestTop: alice sends 20 requests (5 admitted), bob 3, carol 1; GET
// /v1/top lists alice first by denials and by requests, each count within
// the bound, and the counts leave the minute window a minute later.
func TestTop(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	for range 20 {
		s.decide(t, req("api", "user", "alice"))
	}
	for range 3 {
		s.decide(t, req("api", "user", "bob"))
	}
	s.decide(t, req("api", "user", "carol"))
	s.decide(t, req("api", "nobody", "x")) // no rule: not counted

	var top topBody
	get(t, s.srv.URL+"/v1/top?domain=api&key=user&by=denied&window=1m", 200, &top)
	if !top.Counted || top.Total != 15 || len(top.Clients) != 1 || top.Clients[0].Value != "alice" ||
		top.Clients[0].Count < 15 || top.Clients[0].Count > 15+top.ErrorBound {
		t.Errorf("denied: %+v, want alice 15 of 15", top)
	}
	get(t, s.srv.URL+"/v1/top?domain=api&key=user&by=requests&window=1h&n=2", 200, &top)
	if top.Total != 24 || len(top.Clients) != 2 || top.Clients[0].Value != "alice" || top.Clients[1].Value != "bob" {
		t.Errorf("requests: %+v, want alice, bob of 24", top)
	}
	get(t, s.srv.URL+"/v1/top?domain=api&key=nobody", 200, &top)
	if top.Counted || len(top.Keys) != 1 || top.Keys[0] != (observe.Key{Domain: "api", Key: "user"}) {
		t.Errorf("uncounted key: %+v, want counted false and keys [api user]", top)
	}
	s.clk.Advance(61 * time.Second)
	get(t, s.srv.URL+"/v1/top?domain=api&key=user&by=requests", 200, &top)
	if top.Total != 0 || len(top.Clients) != 0 {
		t.Errorf("a minute later: %+v, want nothing", top)
	}
	get(t, s.srv.URL+"/v1/top?domain=api&key=user&by=requests&window=1h", 200, &top)
	if top.Total != 24 {
		t.Errorf("an hour's window a minute later: total %d, want 24", top.Total)
	}
}

// TestShadowDenied: a shadow-mode descriptor over its limit counts as a
// denial though it is answered OK.
func TestShadowDenied(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	for range 3 {
		if resp := s.decide(t, req("api", "remote_address", "10.0.0.1")); resp.Overall != decide.OK {
			t.Fatalf("shadow mode answered %v", resp.Overall)
		}
	}
	var top topBody
	get(t, s.srv.URL+"/v1/top?domain=api&key=remote_address", 200, &top)
	if top.Total != 2 || len(top.Clients) != 1 || top.Clients[0].Value != "10.0.0.1" {
		t.Errorf("%+v, want 10.0.0.1 denied twice", top)
	}
}

func TestTopRefusals(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	for _, q := range []string{"window=5m", "by=ok", "n=0", "n=101", "n=x", "domain=api", "key=user", "domian=api&key=user"} {
		get(t, s.srv.URL+"/v1/top?"+q, 400, nil)
	}
}

// TestMaxKeys: keys beyond MaxKeys are not counted, and the memory stays
// what MaxKeys allows.
func TestMaxKeys(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{MaxKeys: 1})
	s.decide(t, req("api", "user", "alice"))
	s.decide(t, req("api", "remote_address", "10.0.0.1"))
	if ks := s.obs.Keys(); len(ks) != 1 || ks[0].Key != "user" {
		t.Errorf("keys %v, want only api/user", ks)
	}
	for i := range 1000 { // many clients: the memory stays
		s.decide(t, req("api", "user", "u"+strconv.Itoa(i)))
	}
	if b, want := s.obs.Bytes(), 2*sketch.BytesFor(sketch.Config{}); b != want || want > 500<<10 {
		t.Errorf("Bytes %d, want %d (two default sketches, under 500 KiB)", b, want)
	}
	if _, err := observe.New(observe.Config{MaxKeys: observe.MaxMaxKeys + 1}); err == nil {
		t.Error("MaxKeys above the cap accepted")
	}
}

// TestKeys: GET /v1/keys shows a client's state under the limits of each
// prefix of its entries, and looking takes nothing.
func TestKeys(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	s.decide(t, req("api", "user", "al/ice", "api", "send"))
	s.decide(t, req("api", "user", "al/ice", "api", "send"))
	s.decide(t, req("api", "user", "al/ice", "api", "send"))
	type body struct {
		Descriptors []struct {
			Rule, Code, Limit string
			Remaining         int64
			DeniesNext        bool `json:"denies_next"`
			Limits            []struct {
				Remaining  int64
				DeniesNext bool `json:"denies_next"`
			}
		}
	}
	for range 2 { // twice: the first look must not count
		var b body
		get(t, s.srv.URL+"/v1/keys/api/user/al%2Fice/api/send", 200, &b)
		if len(b.Descriptors) != 2 {
			t.Fatalf("%+v, want two descriptors", b)
		}
		if d := b.Descriptors[0]; d.Rule != "api.user" || d.Code != "OK" || d.Remaining != 5 || d.DeniesNext {
			t.Errorf("user: %+v, want OK with 5 remaining (the requests were of user+api only)", d)
		}
		if d := b.Descriptors[1]; d.Rule != "api.user.api_send" || d.Code != "OK" || d.Remaining != 0 || !d.DeniesNext ||
			len(d.Limits) != 1 || d.Limits[0].Remaining != 0 || !d.Limits[0].DeniesNext {
			t.Errorf("user+api: %+v, want none remaining, the next denied", d)
		}
	}
	for _, p := range []string{"api", "api/user", "api/user/a/b", "api/" + strings.Repeat("k/v/", 9), "api//v"} {
		get(t, s.srv.URL+"/v1/keys/"+p, 400, nil)
	}
}

// TestKeysEveryLimit: GET /v1/keys shows every limit of the rule with its
// own remaining and reset, not only the one that binds.
func TestKeysEveryLimit(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	for range 3 {
		s.decide(t, req("api", "tenant", "acme"))
	}
	s.clk.Advance(10 * time.Second)
	type limit struct {
		Limit, ID, Throttling string
		RulesFile             string `json:"rules_file"`
		Remaining             int64
		ResetAfter            string `json:"reset_after"`
		DeniesNext            bool   `json:"denies_next"`
	}
	var b struct {
		Descriptors []struct {
			Limit     string
			LimitID   string `json:"limit_id"`
			Remaining int64
			Limits    []limit
		}
	}
	get(t, s.srv.URL+"/v1/keys/api/tenant/acme", 200, &b)
	if len(b.Descriptors) != 1 || len(b.Descriptors[0].Limits) != 2 {
		t.Fatalf("%+v, want one descriptor with two limits", b)
	}
	d := b.Descriptors[0]
	want := []limit{
		{Limit: "5/1m0s", RulesFile: "rules.yaml:15", Remaining: 2, ResetAfter: "50s"},
		{Limit: "55/1h0m0s", Throttling: "soft", RulesFile: "rules.yaml:16", Remaining: 47, ResetAfter: "59m50s"},
	}
	for i, w := range want {
		got := d.Limits[i]
		w.ID = got.ID
		if got != w || got.ID == "" {
			t.Errorf("limit %d: %+v, want %+v", i, got, w)
		}
	}
	if d.Limit != "5/1m0s" || d.LimitID != d.Limits[0].ID || d.Remaining != 2 {
		t.Errorf("binding limit %s (%s), %d remaining; want the first, 2", d.Limit, d.LimitID, d.Remaining)
	}
}

// TestKeysStoreDown: a store that cannot answer gets 503, an invalid
// request 400.
func TestKeysStoreDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"store down", errors.New("redis: connection refused"), http.StatusServiceUnavailable},
		{"invalid", fmt.Errorf("%w: too long", decide.ErrInvalidRequest), http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := observe.KeysHandler(inspectFunc(func(context.Context, *decide.Request) (*decide.Inspection, error) { return nil, tc.err }))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/keys/api/user/alice", nil))
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.err.Error()) {
				t.Errorf("%d %s, want %d with the error", w.Code, w.Body, tc.want)
			}
		})
	}
}

// inspectFunc is an observe.Inspector that calls itself.
type inspectFunc func(context.Context, *decide.Request) (*decide.Inspection, error)

func (f inspectFunc) Inspect(ctx context.Context, r *decide.Request) (*decide.Inspection, error) {
	return f(ctx, r)
}

// TestDenialLog: at most DenialLogRate lines a second, and the next line
// says how many were left out.
func TestDenialLog(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{DenialLogRate: 2})
	for range 15 {
		s.decide(t, req("api", "user", "alice")) // 10 denied
	}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	if ls := lines(); len(ls) != 2 {
		t.Fatalf("%d lines for 10 denials at once, want 2:\n%s", len(ls), s.log)
	}
	l := lines()[0]
	for k, want := range map[string]any{"msg": "denied", "domain": "api", "descriptor": "user=alice", "rule": "api.user",
		"limit": "5/1m0s", "rules_file": "rules.yaml:5"} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v", k, l[k], want)
		}
	}
	if ra, ok := l["retry_after"].(float64); !ok || ra <= 0 {
		t.Errorf("retry_after %v, want a positive duration", l["retry_after"])
	}
	s.clk.Advance(time.Second)
	s.decide(t, req("api", "user", "alice"))
	ls := lines()
	if len(ls) != 3 || ls[2]["unlogged_before"] != float64(8) {
		t.Errorf("after a second: %d lines, last %v, want 3 with unlogged_before 8", len(ls), ls[len(ls)-1])
	}
}

// TestDenialLogRefill: a line is logged as soon as the sample has a
// token again, not later (the Watcher skips the limiter until then).
func TestDenialLogRefill(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{DenialLogRate: 2}) // a token every 500 ms, burst 2
	nlines := func() int { return strings.Count(s.log.String(), "\n") }
	for range 8 {
		s.decide(t, req("api", "user", "alice")) // 5 pass, 3 denied: 2 logged
	}
	if n := nlines(); n != 2 {
		t.Fatalf("%d lines, want 2:\n%s", n, s.log)
	}
	s.clk.Advance(499 * time.Millisecond)
	s.decide(t, req("api", "user", "alice"))
	if n := nlines(); n != 2 {
		t.Fatalf("499 ms on: %d lines, want 2:\n%s", n, s.log)
	}
	s.clk.Advance(time.Millisecond)
	s.decide(t, req("api", "user", "alice"))
	if n := nlines(); n != 3 || !strings.Contains(s.log.String(), `"unlogged_before":2`) {
		t.Fatalf("500 ms on: %d lines, want 3, the last with unlogged_before 2:\n%s", n, s.log)
	}
}

// BenchmarkObserve decides a request of one descriptor of 10,000 users on
// the memory store, alone and watched by a Watcher with its default Config
// (the denial log on): the difference is what counting (and, for
// result=denied, the denial log's sampling) costs a decision. Compare
// with benchstat -col /observe.
func BenchmarkObserve(b *testing.B) {
	s := newStack(b, observe.Config{})
	for _, result := range []string{"ok", "denied"} {
		reqs := make([]*decide.Request, 10000)
		for i := range reqs {
			reqs[i] = req("api", "user", result+"-"+strconv.Itoa(i))
			if result == "ok" {
				reqs[i].Descriptors[0].Cost = 0 // decisions stay OK
				continue
			}
			for range 6 { // over the limit of 5 a minute, on a clock that stands still
				s.decide(b, reqs[i])
			}
		}
		for _, bc := range []struct {
			name string
			d    decide.Decider
		}{{"without", s.plain}, {"with", s.svc}} {
			b.Run("result="+result+"/observe="+bc.name, func(b *testing.B) {
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					resp, err := bc.d.Decide(ctx, reqs[i%len(reqs)])
					if err != nil {
						b.Fatal(err)
					}
					if got := resp.Overall == decide.OK; got != (result == "ok") {
						b.Fatalf("%s: decided %v", reqs[i%len(reqs)].Descriptors[0].Entries[0].Value, resp.Overall)
					}
					i++
				}
			})
		}
	}
}

func FuzzKeysPath(f *testing.F) {
	s := newStack(f, observe.Config{})
	for _, seed := range []string{"api/user/alice", "api/user/al%2Fice/api/send", "api//", "%zz", "a/b/c/d/e"} {
		f.Add(seed)
	}
	h := observe.KeysHandler(s.svc)
	f.Fuzz(func(t *testing.T, p string) {
		r, err := http.NewRequest("GET", "http://x/", nil)
		if err != nil {
			t.Skip()
		}
		r.URL.Path, r.URL.RawPath = "/v1/keys/"+p, ""
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 && w.Code != 400 {
			t.Fatalf("%q: %d %s", p, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%q: body %q", p, w.Body)
		}
	})
}

func FuzzTopQuery(f *testing.F) {
	s := newStack(f, observe.Config{})
	s.decide(f, req("api", "user", "alice"))
	for _, seed := range []string{"domain=api&key=user", "by=requests&window=1h&n=3", "n=-1", "window=%zz"} {
		f.Add(seed)
	}
	h := s.obs.TopHandler()
	f.Fuzz(func(t *testing.T, q string) {
		r := httptest.NewRequest("GET", "http://x/v1/top", nil)
		r.URL.RawQuery = q
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 && w.Code != 400 {
			t.Fatalf("%q: %d %s", q, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%q: body %q", q, w.Body)
		}
	})
}

var _ = fmt.Sprint

// TestTopNamesDenyingRule: a client denied by a nested rule (user=alice
// with api=send, 2 a minute) is listed under its own key with the rule
// and the whole descriptor that denied it, which the dashboard looks up;
// the fixed level (api=send, the same for every user) is not listed as a
// client. Before, api=send topped the list and a lookup of it alone
// matched no rule: "admitted" (issue 35).
func TestTopNamesDenyingRule(t *testing.T) {
	t.Parallel()
	s := newStack(t, observe.Config{})
	for range 4 {
		s.decide(t, req("api", "user", "alice", "api", "send"))
	}
	s.decide(t, req("api", "user", "bob", "api", "send"))
	type topJSON struct {
		Counted bool
		Clients []struct {
			Value      string
			Count      uint64
			Rule       string
			Descriptor []decide.Entry
		}
	}
	var top topJSON
	get(t, s.srv.URL+"/v1/top?domain=api&key=api", http.StatusOK, &top)
	if top.Counted || len(top.Clients) != 0 {
		t.Errorf("key api (a fixed level) counted as clients: %+v", top)
	}
	top = topJSON{}
	get(t, s.srv.URL+"/v1/top?domain=api&key=user", http.StatusOK, &top)
	if len(top.Clients) != 1 {
		t.Fatalf("denied users: %+v, want alice alone", top.Clients)
	}
	c := top.Clients[0]
	want := []decide.Entry{{Key: "user", Value: "alice"}, {Key: "api", Value: "send"}}
	if c.Value != "alice" || c.Count != 2 || c.Rule != "api.user.api_send" || fmt.Sprint(c.Descriptor) != fmt.Sprint(want) {
		t.Errorf("top client %+v, want alice denied twice under api.user.api_send with %v", c, want)
	}
	// A descriptor of one entry is its key and value: nothing more to say.
	for range 6 {
		s.decide(t, req("api", "user", "carol"))
	}
	top = topJSON{}
	get(t, s.srv.URL+"/v1/top?domain=api&key=user", http.StatusOK, &top)
	found := false
	for _, c := range top.Clients {
		if c.Value == "carol" {
			found = true
			if c.Rule != "" || c.Descriptor != nil {
				t.Errorf("carol: %+v, want neither rule nor descriptor", c)
			}
		}
	}
	if !found {
		t.Errorf("carol not listed: %+v", top.Clients)
	}
}
