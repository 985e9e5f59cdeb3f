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

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
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
