package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/redisdb"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/admin"
)

const tokensFile = `# name role secret
alice write alice-secret-0123456789
rita  read  rita-secret-0123456789
`

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

type fixture struct {
	url     string
	db      *redisdb.DB
	reg     *prometheus.Registry
	handler *admin.Handler
}

func start(t *testing.T, addr string, readOnly bool) *fixture {
	t.Helper()
	// 2s (the default): the writes of the tests on a loaded machine must
	// not time out (control's tests did at 500ms); TestDatabaseDown waits
	// it out once, on a paused Redis.
	db, err := redisdb.Open("redis://"+addr, redisdb.Config{Name: fmt.Sprintf("admin:%s:%d", strings.NewReplacer("{", "(", "}", ")").Replace(t.Name()), time.Now().UnixNano()), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Log: log, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := admin.ParseTokens("tokens", []byte(tokensFile))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, ReadOnly: readOnly, Log: log, Registerer: reg, MaxBodyBytes: 64 << 10,
		Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{url: srv.URL, db: db, reg: reg, handler: h}
}

type reply struct {
	code   int
	header http.Header
	body   string
}

func (f *fixture) do(t *testing.T, method, path, token, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func (f *fixture) generation(t *testing.T) int64 {
	t.Helper()
	g, err := f.db.Generation(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const (
	alice = "alice-secret-0123456789"
	rita  = "rita-secret-0123456789"
)

func apiDoc(n int) string {
	return fmt.Sprintf("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

func TestAdminAPI(t *testing.T) {
	f := start(t, testenv.RedisAddr(t), false)
	r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(100))
	if r.code != 201 || r.header.Get("ETag") != `"v1"` {
		t.Fatalf("first PUT: %d %s", r.code, r.body)
	}
	// JSON is read as YAML is.
	r = f.do(t, "PUT", "/v1/admin/domains/api", alice, `{"domain": "api", "descriptors": [{"key": "tenant", "rate_limit": {"unit": "second", "requests_per_unit": 200}}]}`, "If-Match", `"v1"`)
	if r.code != 200 || r.header.Get("ETag") != `"v2"` {
		t.Fatalf("JSON PUT: %d %s", r.code, r.body)
	}
	// Every mistake at once, at the submitted document's lines.
	r = f.do(t, "PUT", "/v1/admin/domains/api", alice, "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n    colour: red\n")
	var eb struct {
		Errors []struct {
			Line int    `json:"line"`
			Text string `json:"text"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(r.body), &eb); r.code != 400 || err != nil || len(eb.Errors) != 2 || eb.Errors[0].Line != 4 || eb.Errors[1].Line != 5 || !strings.HasPrefix(eb.Errors[0].Text, "request:4: ") {
		t.Fatalf("bad PUT: %d %s", r.code, r.body)
	}
	gen := f.generation(t)
	// A stale If-Match: 412, nothing changes.
	if r = f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(300), "If-Match", `"v1"`); r.code != 412 {
		t.Fatalf("stale If-Match: %d %s", r.code, r.body)
	}
	// Wrong, missing and read-only tokens never change anything.
	for _, c := range []struct {
		name, token string
		header      []string
		code        int
	}{
		{"missing", "", nil, 401},
		{"wrong", "alice-secret-012345678X", nil, 401},
		{"empty bearer", " ", nil, 401},
		{"basic auth", "", []string{"Authorization", "Basic YWxpY2U6eA=="}, 401},
		{"read token", rita, nil, 403},
	} {
		for _, w := range []struct{ method, path, body string }{
			{"PUT", "/v1/admin/domains/api", apiDoc(1)},
			{"PUT", "/v1/admin/domains/web", strings.ReplaceAll(apiDoc(1), "api", "web")},
			{"DELETE", "/v1/admin/domains/api", ""},
			{"POST", "/v1/admin/domains/api/rollback", `{"version": 1}`},
			{"PUT", "/v1/admin/overrides", `{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], "rate_limits": [{"unit": "second", "requests_per_unit": 1}]}`},
		} {
			if r := f.do(t, w.method, w.path, c.token, w.body, c.header...); r.code != c.code {
				t.Errorf("%s: %s %s: %d %s, want %d", c.name, w.method, w.path, r.code, r.body, c.code)
			}
		}
		if r := f.do(t, "GET", "/v1/admin/domains/api", c.token, "", c.header...); (c.code == 401) != (r.code == 401) {
			t.Errorf("%s: GET: %d", c.name, r.code)
		}
	}
	if g := f.generation(t); g != gen {
		t.Fatalf("the generation moved from %d to %d", gen, g)
	}
	// A read token may read and dry-run.
	r = f.do(t, "GET", "/v1/admin/domains/api", rita, "")
	if r.code != 200 || !strings.HasPrefix(r.body, `{"domain": "api"`) || r.header.Get("Content-Type") != "application/json" || r.header.Get("ETag") != `"v2"` || r.header.Get("X-Sluice-Author") != "alice" {
		t.Fatalf("GET: %d %q %v", r.code, r.body, r.header)
	}
	r = f.do(t, "POST", "/v1/admin/validate", rita, apiDoc(250))
	if r.code != 200 || !strings.Contains(r.body, `"dry_run": true`) || !strings.Contains(r.body, "+    rate_limit: {unit: second, requests_per_unit: 250}") {
		t.Fatalf("validate: %d %s", r.code, r.body)
	}
	// History, then a rollback restores exactly version 1.
	r = f.do(t, "POST", "/v1/admin/domains/api/rollback", alice, `{"version": 1}`)
	if r.code != 200 || r.header.Get("ETag") != `"v3"` {
		t.Fatalf("rollback: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/v1/admin/domains/api", rita, ""); r.body != apiDoc(100) {
		t.Fatalf("after rollback: %q", r.body)
	}
	r = f.do(t, "GET", "/v1/admin/domains/api/history", rita, "")
	var hist struct {
		Versions []struct {
			Version int64  `json:"version"`
			Author  string `json:"author"`
			Note    string `json:"note"`
			Diff    string `json:"diff"`
		} `json:"versions"`
	}
	if err := json.Unmarshal([]byte(r.body), &hist); err != nil || len(hist.Versions) != 3 || hist.Versions[0].Note != "rollback to version 1" || hist.Versions[2].Author != "alice" {
		t.Fatalf("history: %s", r.body)
	}
	// Overrides: set with a ttl, get, list, delete.
	r = f.do(t, "PUT", "/v1/admin/overrides", alice, `{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], "rate_limits": [{"unit": "second", "requests_per_unit": 500}], "ttl": "1h"}`)
	var ov struct {
		ID      string    `json:"id"`
		Expires time.Time `json:"expires"`
		Author  string    `json:"author"`
	}
	if err := json.Unmarshal([]byte(r.body), &ov); r.code != 200 || err != nil || !ov.Expires.Equal(t0.Add(time.Hour)) || ov.Author != "alice" {
		t.Fatalf("set override: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/v1/admin/overrides/"+ov.ID, rita, ""); r.code != 200 || !strings.Contains(r.body, `"requests_per_unit": 500`) {
		t.Fatalf("get override: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/v1/admin/overrides", rita, ""); r.code != 200 || strings.Count(r.body, `"id"`) != 1 {
		t.Fatalf("list overrides: %d %s", r.code, r.body)
	}
	if r = f.do(t, "PUT", "/v1/admin/overrides", alice, `{"domain": "api", "entries": [{"key": "nope", "value": "x"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}]}`); r.code != 400 {
		t.Fatalf("override without a rule: %d %s", r.code, r.body)
	}
	if r = f.do(t, "DELETE", "/v1/admin/overrides/"+ov.ID, alice, ""); r.code != 204 {
		t.Fatalf("delete override: %d %s", r.code, r.body)
	}
	if r = f.do(t, "GET", "/v1/admin/overrides/"+ov.ID, rita, ""); r.code != 404 {
		t.Fatalf("deleted override: %d %s", r.code, r.body)
	}
	// Caps: a body above the cap is 413.
	if r = f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)+"# "+strings.Repeat("x", 70<<10)+"\n"); r.code != 413 {
		t.Fatalf("huge body: %d %s", r.code, r.body)
	}
	// Calls are counted by token and status.
	if n := testutil.ToFloat64(admin.CallsCounter(f.reg, "rita", "403")); n != 5 {
		t.Fatalf("rita's 403s: %v", n)
	}
}

func TestReadOnly(t *testing.T) {
	f := start(t, testenv.RedisAddr(t), true)
	if r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)); r.code != 403 || !strings.Contains(r.body, "read-only") {
		t.Fatalf("read-only PUT: %d %s", r.code, r.body)
	}
	if r := f.do(t, "PUT", "/v1/admin/domains/api?dry_run=true", alice, apiDoc(1)); r.code != 200 {
		t.Fatalf("read-only dry run: %d %s", r.code, r.body)
	}
	if g := f.generation(t); g != 0 {
		t.Fatalf("generation %d", g)
	}
}

// TestDatabaseDown: writes answer 503 and nothing is half-written.
func TestDatabaseDown(t *testing.T) {
	rs := testenv.StartRedis(t)
	f := start(t, rs.Addr, false)
	if r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)); r.code != 201 {
		t.Fatalf("PUT: %d %s", r.code, r.body)
	}
	rs.Pause()
	r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(2))
	rs.Resume()
	if r.code != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("PUT with the database paused: %d %s", r.code, r.body)
	}
	rs.Kill()
	// A 503 says what failed, not where: no address of the database.
	host, port, _ := strings.Cut(rs.Addr, ":")
	for _, c := range []struct{ method, body string }{{"PUT", apiDoc(3)}, {"GET", ""}} {
		r := f.do(t, c.method, "/v1/admin/domains/api", alice, c.body)
		if r.code != 503 || strings.Contains(r.body, host) || strings.Contains(r.body, port) || !strings.Contains(r.body, "unavailable") {
			t.Fatalf("%s with the database killed: %d %s", c.method, r.code, r.body)
		}
	}
}

func TestParseTokens(t *testing.T) {
	for _, c := range []struct{ name, file, want string }{
		{"ok", tokensFile, ""},
		{"fields", "a write\n", "f:1: 2 fields"},
		{"role", "a admin aaaaaaaaaaaaaaaaaaaa\n", `f:1: role "admin"`},
		{"short", "# c\na write short\n", `f:2: the secret of "a" is 5 bytes`},
		{"dup name", "a read aaaaaaaaaaaaaaaaaaaa\na write bbbbbbbbbbbbbbbbbbbbbb\n", `f:2: token name "a" repeated (first at line 1)`},
		{"dup secret", "a read aaaaaaaaaaaaaaaaaaaa\nb write aaaaaaaaaaaaaaaaaaaa\n", `f:2: the secret of "b" is the one at line 1`},
		{"empty", "# nothing\n", "f: no tokens"},
		{"long line", "a read " + strings.Repeat("s", 5000) + "\n", "f:1: bufio.Scanner: token too long"},
		{"huge", strings.Repeat("#", admin.MaxTokensFileBytes+1), "too large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, err := admin.ParseTokens("f", []byte(c.file))
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tok, ok := ts.Lookup(alice); !ok || tok.Name != "alice" || tok.Role != admin.RoleWrite {
					t.Fatalf("Lookup: %+v %v", tok, ok)
				}
				if _, ok := ts.Lookup("alice-secret-012345678"); ok {
					t.Fatal("a prefix of a secret matched")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if strings.Contains(fmt.Sprint(err), "bbbbbbbb") {
				t.Fatal("a secret in an error")
			}
		})
	}
}

func TestDecodeOverride(t *testing.T) {
	ok := `{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}]`
	for _, c := range []struct{ body, want string }{
		{ok + `}`, ""},
		{ok + `, "ttl": "30m"}`, ""},
		{ok + `, "ttl": "-1s"}`, "ttl"},
		{ok + `, "ttl": "9000h"}`, "ttl"},
		{ok + `, "ttl": "1h", "expires": "2027-01-01T00:00:00Z"}`, "give one"},
		{ok + `, "colour": "red"}`, "unknown field"},
		{ok + `} {}`, "more than one"},
		{`{"domain": "api"}`, "required"},
		{`[]`, "cannot unmarshal"},
	} {
		o, err := admin.DecodeOverride([]byte(c.body), t0)
		if c.want == "" {
			if err != nil || o.Domain != "api" {
				t.Errorf("%s: %+v %v", c.body, o, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}

// FuzzDecodeOverride: whatever the body, DecodeOverride never panics and
// what it accepts has a domain, entries and limits, and an expiry that is
// none or after now.
func FuzzDecodeOverride(f *testing.F) {
	f.Add([]byte(`{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}], "ttl": "1h"}`))
	f.Add([]byte(`{"domain": "api", "entries": [], "rate_limits": null, "expires": "2027-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"ttl": "1e9h"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := admin.DecodeOverride(body, t0)
		if err != nil {
			return
		}
		if o.Domain == "" || len(o.Entries) == 0 || len(o.Limits) == 0 {
			t.Fatalf("accepted %+v", o)
		}
	})
}

// FuzzOverrideID: an id reads back to the override it names, and any
// string either reads to an id that is itself, or is refused.
func FuzzOverrideID(f *testing.F) {
	f.Add("api", "tenant", "acme", "eyJkIjoiYXBpIiwiZSI6W119")
	f.Add("", "", "", "!!")
	f.Fuzz(func(t *testing.T, domain, key, value, id string) {
		if !utf8.ValidString(domain) || !utf8.ValidString(key) || !utf8.ValidString(value) {
			return // refused by SetOverride (TestEditor); JSON cannot keep it
		}
		entries := []rules.Entry{{Key: key, Value: value}}
		d, es, err := control.ParseOverrideID(control.OverrideID(domain, entries))
		if err != nil || d != domain || len(es) != 1 || es[0] != entries[0] {
			t.Fatalf("round trip of %q %v: %q %v %v", domain, entries, d, es, err)
		}
		if d, es, err := control.ParseOverrideID(id); err == nil && control.OverrideID(d, es) != id {
			t.Fatalf("%q reads as %q %v, whose id is another", id, d, es)
		}
	})
}

// FuzzParseTokens: a tokens file never panics the parser, and every
// token it accepts is found by its secret.
func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(tokensFile))
	f.Add([]byte("a read 0123456789abcdef\n\tb\twrite\t0123456789abcdeg\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := admin.ParseTokens("f", data)
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			fs := strings.Fields(line)
			if len(fs) == 3 && !strings.HasPrefix(strings.TrimSpace(line), "#") {
				if tok, ok := ts.Lookup(fs[2]); !ok || tok.Name != fs[0] {
					t.Fatalf("token %q not found by its secret", fs[0])
				}
			}
		}
	})
}

// FuzzRequest sends any method, path, token, If-Match and body to the
// admin API over a real rules database: it never answers 500, and a call
// answered 4xx or without a write token changes nothing.
func FuzzRequest(f *testing.F) {
	f.Add(uint8(1), "/v1/admin/domains/api", uint8(0), `"v1"`, []byte(apiDoc(5)))
	f.Add(uint8(1), "/v1/admin/overrides", uint8(0), "", []byte(`{"domain": "api", "entries": [{"key": "tenant", "value": "a"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}], "ttl": "1h"}`))
	f.Add(uint8(2), "/v1/admin/domains/api/rollback", uint8(1), "*", []byte(`{"version": 1}`))
	f.Add(uint8(0), "/v1/admin/domains/api/history", uint8(2), "", []byte(nil))
	f.Add(uint8(3), "/v1/admin/overrides/eyJkIjoiYXBpIiwiZSI6W3sia2V5IjoidGVuYW50IiwidmFsdWUiOiJhIn1dfQ", uint8(0), "", []byte(nil))
	f.Add(uint8(2), "/v1/admin/validate", uint8(1), "", []byte("domain: api\ndescriptors: [{key: x, rate_limit: {unit: day, requests_per_unit: 1}}]"))
	addr := os.Getenv(testenv.RedisAddrEnv)
	if addr == "" {
		f.Skip("no Redis: " + testenv.RedisAddrEnv)
	}
	db, err := redisdb.Open("redis://"+addr, redisdb.Config{Name: fmt.Sprintf("fuzz:%d", time.Now().UnixNano())})
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Log: log})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := ed.PutDomain(context.Background(), "seed", "api", []byte(apiDoc(1)), "", false); err != nil {
		f.Fatal(err)
	}
	toks, _ := admin.ParseTokens("tokens", []byte(tokensFile))
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, Log: log, MaxBodyBytes: 64 << 10})
	if err != nil {
		f.Fatal(err)
	}
	methods := []string{"GET", "PUT", "POST", "DELETE", "PATCH"}
	secrets := []string{alice, rita, "", "wrong-secret-0123456789"}
	f.Fuzz(func(t *testing.T, m uint8, path string, tok uint8, ifMatch string, body []byte) {
		u, err := url.Parse(path)
		if err != nil || !strings.HasPrefix(path, "/") {
			return
		}
		req := httptest.NewRequest(methods[int(m)%len(methods)], "http://admin"+u.RequestURI(), bytes.NewReader(body))
		if s := secrets[int(tok)%len(secrets)]; s != "" {
			req.Header.Set("Authorization", "Bearer "+s)
		}
		if ifMatch != "" && !strings.ContainsAny(ifMatch, "\r\n") {
			req.Header.Set("If-Match", ifMatch)
		}
		before, err := db.Generation(context.Background())
		if err != nil {
			t.Skip(err)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		after, err := db.Generation(context.Background())
		if err != nil {
			t.Skip(err)
		}
		code := w.Code
		if code >= 500 && code != 503 {
			t.Fatalf("%s %s: %d %s", req.Method, path, code, w.Body)
		}
		if after != before && (code >= 400 || secrets[int(tok)%len(secrets)] != alice) {
			t.Fatalf("%s %s answered %d by token %d, yet the database changed", req.Method, path, code, tok)
		}
	})
}

// TestSlowBody: a body that does not arrive within BodyTimeout is cut
// off, and nothing is written.
func TestSlowBody(t *testing.T) {
	db, err := redisdb.Open("redis://"+testenv.RedisAddr(t), redisdb.Config{Name: fmt.Sprintf("slow:%d", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ed, _ := control.NewEditor(control.EditorConfig{DB: db, Log: log})
	toks, _ := admin.ParseTokens("tokens", []byte(tokensFile))
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, Log: log, BodyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("PUT", srv.URL+"/v1/admin/domains/api", pr)
	req.Header.Set("Authorization", "Bearer "+alice)
	req.ContentLength = 1000
	go pw.Write([]byte("domain: api\n")) // and then nothing
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "timeout") {
			t.Fatalf("slow body: %d %s", resp.StatusCode, b)
		}
	}
	if g, err := db.Generation(context.Background()); err != nil || g != 0 {
		t.Fatalf("generation %d, %v", g, err)
	}
}

// TestConcurrentPUT: two writers over HTTP with the same If-Match: one
// gets 200, the other 412, and the domain holds the winner's document.
func TestConcurrentPUT(t *testing.T) {
	f := start(t, testenv.RedisAddr(t), false)
	if r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)); r.code != 201 {
		t.Fatalf("first PUT: %d %s", r.code, r.body)
	}
	for round := range 10 {
		etag := f.do(t, "GET", "/v1/admin/domains/api", rita, "").header.Get("ETag")
		codes := make([]int, 2)
		done := make(chan struct{})
		for i := range 2 {
			go func() {
				defer func() { done <- struct{}{} }()
				req, _ := http.NewRequest("PUT", f.url+"/v1/admin/domains/api", strings.NewReader(apiDoc(100*round+i+2)))
				req.Header.Set("Authorization", "Bearer "+alice)
				req.Header.Set("If-Match", etag)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				resp.Body.Close()
				codes[i] = resp.StatusCode
			}()
		}
		<-done
		<-done
		won := slices.Index(codes, 200)
		if won < 0 || codes[1-won] != 412 {
			t.Fatalf("round %d: %v, want one 200 and one 412", round, codes)
		}
		if r := f.do(t, "GET", "/v1/admin/domains/api", rita, ""); r.body != apiDoc(100*round+won+2) {
			t.Fatalf("round %d: the domain holds %q, not the winner's", round, r.body)
		}
	}
}

// TestTokensFile: a token removed from the file stops working without a
// restart, a new one works, and a file that does not read (a mistake, no
// file) revokes every token until it reads again, said once per change.
func TestTokensFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		t.Helper()
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // a new inode, as editors and Secrets do
			t.Fatal(err)
		}
	}
	write(tokensFile)
	var errs []error
	tf, err := admin.WatchTokens(path, func(err error) { errs = append(errs, err) })
	if err != nil {
		t.Fatal(err)
	}
	if tok, ok := tf.Lookup(alice); !ok || tok.Name != "alice" {
		t.Fatal("alice's token refused")
	}
	carol := "carol-secret-0123456789"
	write("carol write " + carol + "\n")
	if _, ok := tf.Lookup(alice); ok {
		t.Fatal("a removed token still works")
	}
	if tok, ok := tf.Lookup(carol); !ok || tok.Name != "carol" {
		t.Fatal("a new token refused")
	}
	// One mistake: every token is refused, carol's too.
	write("carol write " + carol + "\ndave admin dave-secret-0123456789\n")
	for range 3 {
		if _, ok := tf.Lookup(carol); ok {
			t.Fatal("a file with a mistake kept a token")
		}
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `role "admin"`) || !strings.Contains(errs[0].Error(), "every admin token is refused") {
		t.Fatalf("errors: %v", errs)
	}
	write("carol write " + carol + "\n")
	if _, ok := tf.Lookup(carol); !ok {
		t.Fatal("the file fixed, carol's token refused")
	}
	// No file: every token is refused until it is back.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, ok := tf.Lookup(carol); ok {
		t.Fatal("a removed file kept a token")
	}
	if _, ok := tf.Lookup(carol); ok || len(errs) != 2 || !strings.Contains(errs[1].Error(), "no such file") {
		t.Fatalf("errors: %v", errs)
	}
	write("carol write " + carol + "\n")
	if _, ok := tf.Lookup(carol); !ok {
		t.Fatal("the file back, carol's token refused")
	}
}
