package admin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/admin"
)

// acmeOverride is the override TestAuthTable's database holds.
var acmeOverride = rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "acme"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}}

// TestAuthTable calls every route of the admin API with each role of
// token, with dry_run absent, true, false and mistyped, on a server that
// is read-only and one that is not, over a database holding a domain at
// version 2 and an override: only a write token's call without a dry run
// on a writable server changes the database, every other is answered
// without a write (a read route or a dry run 200, a write 403, a
// mistyped dry_run 400).
func TestAuthTable(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ovID := control.OverrideID(acmeOverride.Domain, acmeOverride.Entries)
	// A call of each route that succeeds for a write token.
	calls := map[string]struct{ path, body string }{
		"GET /v1/admin/domains":                    {"/v1/admin/domains", ""},
		"GET /v1/admin/domains/{domain}":           {"/v1/admin/domains/api", ""},
		"PUT /v1/admin/domains/{domain}":           {"/v1/admin/domains/api", apiDoc(7)},
		"DELETE /v1/admin/domains/{domain}":        {"/v1/admin/domains/web", ""},
		"GET /v1/admin/domains/{domain}/history":   {"/v1/admin/domains/api/history", ""},
		"POST /v1/admin/domains/{domain}/rollback": {"/v1/admin/domains/api/rollback", `{"version": 1}`},
		"POST /v1/admin/validate":                  {"/v1/admin/validate", apiDoc(9)},
		"GET /v1/admin/overrides":                  {"/v1/admin/overrides", ""},
		"PUT /v1/admin/overrides":                  {"/v1/admin/overrides", `{"domain": "api", "entries": [{"key": "tenant", "value": "bigco"}], "rate_limits": [{"unit": "second", "requests_per_unit": 9}]}`},
		"GET /v1/admin/overrides/{id}":             {"/v1/admin/overrides/" + ovID, ""},
		"DELETE /v1/admin/overrides/{id}":          {"/v1/admin/overrides/" + ovID, ""},
	}
	f0 := start(t, addr, false)
	routes := admin.Routes(f0.handler)
	if len(routes) != len(calls) {
		t.Fatalf("%d routes, %d calls in the table: give each route a call", len(routes), len(calls))
	}
	for _, rt := range routes {
		c, ok := calls[rt.Pattern]
		if !ok {
			t.Fatalf("no call in the table for %s", rt.Pattern)
		}
		method, _, _ := strings.Cut(rt.Pattern, " ")
		for _, role := range []struct{ name, secret string }{{"write", alice}, {"read", rita}} {
			for _, dry := range []string{"", "?dry_run=true", "?dry_run=false", "?dry_run=1", "?dry_run=true&dry_run=false"} {
				for _, ro := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/%s/ro=%v", rt.Pattern, role.name, dry, ro)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						f := start(t, addr, ro)
						seed(t, f)
						before := f.state(t)
						r := f.do(t, method, c.path+dry, role.secret, c.body)
						after := f.state(t)
						isDry := dry == "?dry_run=true"
						badDry := dry == "?dry_run=1" || strings.Contains(dry, "&")
						mayWrite := rt.Write && role.secret == alice && !ro && !isDry && !badDry
						want := 200
						switch {
						case badDry:
							want = 400
						case rt.Write && !isDry && (role.secret != alice || ro):
							want = 403
						}
						if mayWrite {
							if r.code/100 != 2 || after.Generation == before.Generation {
								t.Fatalf("%d %s, generation %d to %d: want a write", r.code, r.body, before.Generation, after.Generation)
							}
							return
						}
						if r.code != want {
							t.Errorf("%d %s, want %d", r.code, r.body, want)
						}
						if after.Generation != before.Generation || len(after.Overrides) != len(before.Overrides) || len(after.Domains) != len(before.Domains) {
							t.Fatalf("answered %d, yet the database changed: generation %d to %d, %d to %d overrides", r.code, before.Generation, after.Generation, len(before.Overrides), len(after.Overrides))
						}
					})
				}
			}
		}
	}
}

// seed puts domain api at version 2, domain web, and acmeOverride.
func seed(t *testing.T, f *fixture) {
	t.Helper()
	ed, err := control.NewEditor(control.EditorConfig{DB: f.db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, d := range []struct{ domain, text string }{{"api", apiDoc(1)}, {"api", apiDoc(2)}, {"web", strings.ReplaceAll(apiDoc(1), "api", "web")}} {
		if _, err := ed.PutDomain(ctx, "seed", d.domain, []byte(d.text), "", false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ed.SetOverride(ctx, "seed", acmeOverride, false); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) state(t *testing.T) *control.State {
	t.Helper()
	st, err := f.db.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}
