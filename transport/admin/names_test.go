package admin_test

import (
	"io"
	"io/fs"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/admin"
)

// TestDomainNames: over a rules directory, a domain's name outside rules'
// grammar is refused with 400 by every route that takes one, its
// document's too, and nothing is written outside the directory (before,
// PUT /v1/admin/domains/..%2F..%2Fpwned wrote pwned.yaml two levels up).
func TestDomainNames(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "rules")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := admin.ParseTokens("tokens", []byte(tokensFile))
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{url: srv.URL}
	if r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)); r.code != 201 {
		t.Fatalf("PUT api: %d %s", r.code, r.body)
	}
	for _, name := range []string{"../../pwned", "../rules/x", "..", ".hidden", "a/b", `a\b`, "with space", "café", "-flag", "x\x00y", strings.Repeat("x", 129)} {
		p := "/v1/admin/domains/" + url.PathEscape(name)
		doc := strings.Replace(apiDoc(1), "domain: api", "domain: "+strconvQuote(name), 1)
		for _, c := range []struct{ method, path, body string }{
			{"PUT", p, doc},
			{"PUT", p + "?dry_run=true", doc},
			{"GET", p, ""},
			{"DELETE", p, ""},
			{"GET", p + "/history", ""},
			{"POST", p + "/rollback", `{"version": 1}`},
			{"POST", "/v1/admin/validate", doc},
			{"PUT", "/v1/admin/overrides", `{"domain": ` + strconvQuote(name) + `, "entries": [{"key": "tenant", "value": "a"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}]}`},
		} {
			r := f.do(t, c.method, c.path, alice, c.body)
			// A path of a ".." segment is cleaned (by the client or
			// ServeMux) to one no route has: 404.
			if r.code != 400 && !(name == ".." && strings.HasPrefix(c.path, "/v1/admin/domains/") && r.code == 404) {
				t.Errorf("%s %s: %d %s, want 400", c.method, c.path, r.code, r.body)
			}
		}
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); strings.HasPrefix(rel, "..") {
			t.Errorf("written outside the rules directory: %s", p)
		}
		if strings.Contains(p, "pwned") || strings.Contains(p, "hidden") {
			t.Errorf("written: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// strconvQuote quotes s for YAML and JSON alike.
func strconvQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestUnavailable503: a rules directory whose metadata cannot be read
// answers 503 without the directory's path, which goes to the log.
func TestUnavailable503(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".sluice-admin", "state.json"), 0o700); err != nil { // a directory where a file is read
		t.Fatal(err)
	}
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := admin.ParseTokens("tokens", []byte(tokensFile))
	h, err := admin.New(admin.Config{Backend: ed, Tokens: toks, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{url: srv.URL}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/admin/domains", ""},
		{"PUT", "/v1/admin/domains/api", apiDoc(1)},
		{"GET", "/v1/admin/overrides", ""},
	} {
		r := f.do(t, c.method, c.path, alice, c.body)
		if r.code != 503 || strings.Contains(r.body, dir) || strings.Contains(r.body, "state.json") {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.code, r.body)
		}
	}
	if !strings.Contains(logged.String(), dir) {
		t.Fatalf("the log does not say where: %s", logged.String())
	}
}

// TestOverrideExpiry: an override's expires is capped as its ttl is, at
// 366 days (2100 was accepted).
func TestOverrideExpiry(t *testing.T) {
	f := start(t, testenv.RedisAddr(t), false)
	if r := f.do(t, "PUT", "/v1/admin/domains/api", alice, apiDoc(1)); r.code != 201 {
		t.Fatalf("PUT: %d %s", r.code, r.body)
	}
	ov := `{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], "rate_limits": [{"unit": "second", "requests_per_unit": 5}], `
	for _, c := range []struct {
		tail string
		code int
	}{
		{`"expires": "2100-01-01T00:00:00Z"}`, 400},
		{`"expires": "` + t0.Add(control.MaxOverrideTTL+time.Second).Format(time.RFC3339) + `"}`, 400},
		{`"ttl": "8785h"}`, 400},
		{`"expires": "` + t0.Add(control.MaxOverrideTTL).Format(time.RFC3339) + `"}`, 200},
		{`"ttl": "8784h"}`, 200},
		{`"expires": "` + t0.Add(-time.Second).Format(time.RFC3339) + `"}`, 400},
		{`"rate_limits": [{"unit": "second", "requests_per_unit": 1}, {"unit": "minute", "requests_per_unit": 2}, {"unit": "hour", "requests_per_unit": 3}, {"unit": "day", "requests_per_unit": 4}, {"unit": "second", "requests_per_unit": 5}, {"unit": "minute", "requests_per_unit": 6}, {"unit": "hour", "requests_per_unit": 7}, {"unit": "day", "requests_per_unit": 8}, {"unit": "week", "requests_per_unit": 9}]}`, 400},
	} {
		body := ov + c.tail
		if strings.HasPrefix(c.tail, `"rate_limits"`) {
			body = `{"domain": "api", "entries": [{"key": "tenant", "value": "acme"}], ` + c.tail
		}
		if r := f.do(t, "PUT", "/v1/admin/overrides", alice, body); r.code != c.code {
			t.Errorf("%s: %d %s, want %d", c.tail, r.code, r.body, c.code)
		}
	}
}
