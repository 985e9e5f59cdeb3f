package filedb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// TestMain checks that the Retrievers and Watchers of the tests leave no
// goroutine behind once closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// tenantDoc is domain api with a rule of n a second per tenant.
func tenantDoc(n int) string {
	return fmt.Sprintf("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

// userDoc is domain api without the tenant rule.
const userDoc = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 7}\n"

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := control.WriteFileAtomic(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// node is what a sluice serve with --rules DIR runs: a Watcher of the
// files and a Retriever that applies the directory's overrides to them.
type node struct {
	w *rules.Watcher
	r *control.Retriever

	mu     sync.Mutex
	errs   []error        // reloads refused
	counts map[string]int // reloads by source
}

func startNode(t *testing.T, dir string, db *filedb.DB, now func() time.Time) *node {
	t.Helper()
	n := &node{counts: map[string]int{}}
	var retr atomic.Pointer[control.Retriever]
	w, err := rules.Loader{}.Watch(dir, func(_ *rules.Set, err error) {
		if err != nil {
			t.Errorf("files: %v", err)
		} else if r := retr.Load(); r != nil {
			r.Rebase()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := control.NewRetriever(context.Background(), control.RetrieverConfig{DB: db, Base: w.Current, Now: now, Poll: -1,
		OnReload: func(_ *rules.Set, source string, _ int64, err error) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if err != nil {
				n.errs = append(n.errs, err)
			}
			n.counts[source]++
		}})
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	retr.Store(r)
	r.Rebase()
	n.w, n.r = w, r
	t.Cleanup(func() { r.Close(); w.Close() })
	return n
}

func (n *node) refused() []error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]error(nil), n.errs...)
}

// limit returns the rate n enforces for tenant, -1 for none.
func (n *node) limit(t *testing.T, tenant string) int64 {
	t.Helper()
	r, err := n.r.Current().Match("api", []rules.Entry{{Key: "tenant", Value: tenant}})
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		return -1
	}
	return r.Limits[0].Limit.Rate
}

// TestOverrides: overrides over a rules directory are kept in
// .sluice-admin/overrides.json, put in force at once in the process that
// writes them, kept across edits of the files, ended by the injected
// clock, kept across a restart; an override the files no longer have a
// rule for leaves the rules in force, and does not stop a node from
// starting.
func TestOverrides(t *testing.T) {
	dir := t.TempDir()
	api := filepath.Join(dir, "api.yaml")
	write(t, api, tenantDoc(100))
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".sluice-admin")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open wrote in the directory: %v", err)
	}
	clk := clocktest.New(t0)
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Now: clk.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, dir, db, clk.Now)
	if got := n.limit(t, "acme"); got != 100 {
		t.Fatalf("start: %d", got)
	}
	ctx := context.Background()
	acme := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "acme"}},
		Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}, Expires: t0.Add(time.Hour)}
	if _, err := ed.SetOverride(ctx, "alice", acme, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the override in force", func() bool { return n.limit(t, "acme") == 500 })
	if got := n.limit(t, "other"); got != 100 {
		t.Fatalf("another tenant: %d", got)
	}
	b, err := os.ReadFile(filepath.Join(dir, ".sluice-admin", "overrides.json"))
	if err != nil || !strings.Contains(string(b), `"author":"alice"`) {
		t.Fatalf("overrides.json: %s, %v", b, err)
	}
	if b, _ := os.ReadFile(api); string(b) != tenantDoc(100) {
		t.Fatalf("api.yaml changed: %s", b)
	}
	list, err := ed.Overrides(ctx)
	if err != nil || len(list) != 1 || list[0].Author != "alice" || !list[0].Expires.Equal(t0.Add(time.Hour)) {
		t.Fatalf("Overrides: %+v, %v", list, err)
	}

	// The files edited by hand: the override stays on the new rules.
	write(t, api, tenantDoc(200))
	testenv.WaitFor(t, "the edited file in force", func() bool { return n.limit(t, "other") == 200 })
	if got := n.limit(t, "acme"); got != 500 {
		t.Fatalf("acme after the edit: %d", got)
	}
	// An edit that drops the rule the override is for is refused whole.
	write(t, api, userDoc)
	testenv.WaitFor(t, "the refusal", func() bool { return len(n.refused()) > 0 })
	if err := n.refused()[0]; !strings.Contains(err.Error(), `no rule with limits matches [tenant="acme"]`) {
		t.Fatalf("refused for: %v", err)
	}
	if a, o := n.limit(t, "acme"), n.limit(t, "other"); a != 500 || o != 200 {
		t.Fatalf("after a refused edit: acme %d, other %d; want the rules in force", a, o)
	}
	write(t, api, tenantDoc(300))
	testenv.WaitFor(t, "the fixed file in force", func() bool { return n.limit(t, "other") == 300 })

	// Expiry by the injected clock.
	clk.Set(t0.Add(time.Hour - time.Nanosecond))
	n.r.Expire()
	if got := n.limit(t, "acme"); got != 500 {
		t.Fatalf("a nanosecond before the end: %d", got)
	}
	clk.Set(t0.Add(time.Hour))
	n.r.Expire()
	if got := n.limit(t, "acme"); got != 300 {
		t.Fatalf("at the end: %d", got)
	}
	clk.Set(t0)
	n.r.Expire()
	if got := n.limit(t, "acme"); got != 500 {
		t.Fatalf("the clock back before the end: %d", got)
	}
	if _, err := ed.DeleteOverride(ctx, "bob", "api", acme.Entries, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the deletion in force", func() bool { return n.limit(t, "acme") == 300 })

	// A restart: the overrides are read from the directory.
	acme.Expires = time.Time{}
	if _, err := ed.SetOverride(ctx, "alice", acme, false); err != nil {
		t.Fatal(err)
	}
	db2, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	if got := startNode(t, dir, db2, clk.Now).limit(t, "acme"); got != 500 {
		t.Fatalf("a node started on the directory: %d", got)
	}
	// A node that starts on files without the override's rule starts
	// with the files alone, and takes the override once they have it.
	write(t, api, userDoc)
	testenv.WaitFor(t, "the refusal", func() bool { return len(n.refused()) > 1 })
	late := startNode(t, dir, db2, clk.Now)
	if got := late.limit(t, "acme"); got != -1 {
		t.Fatalf("a start on files without the tenant rule: %d", got)
	}
	if errs := late.refused(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "no rule with limits matches") {
		t.Fatalf("the start's refusal: %v", errs)
	}
	write(t, api, tenantDoc(400))
	testenv.WaitFor(t, "the override on the fixed files", func() bool { return late.limit(t, "acme") == 500 && late.limit(t, "other") == 400 })
}

// TestOverrideRefused: an override the rules refuse is never written.
func TestOverrideRefused(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "api.yaml"), tenantDoc(100))
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	bad := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "ip", Value: "1.2.3.4"}},
		Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}
	if _, err := ed.SetOverride(context.Background(), "alice", bad, false); !errors.Is(err, control.ErrInvalid) {
		t.Fatalf("an override without a rule: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".sluice-admin", "overrides.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("overrides.json after a refusal: %v", err)
	}
}

// TestPathsInside: whatever a caller asks of the DB itself, a domain's
// name never makes a path outside the rules directory: a change or a
// history read of a name outside rules' grammar is refused as
// ErrInvalid, and nothing is written.
func TestPathsInside(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"../x", "..", ".", "a/b", "/etc/x", ".sluice-admin", ""} {
		if _, err := db.History(ctx, name); !errors.Is(err, control.ErrInvalid) {
			t.Errorf("History(%q): %v", name, err)
		}
		d := control.Doc{Domain: name, Version: 1, Text: "domain: x\n"}
		if _, err := db.Commit(ctx, 0, control.Change{Doc: &d}); !errors.Is(err, control.ErrInvalid) {
			t.Errorf("Commit of %q: %v", name, err)
		}
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Fatalf("the root holds %d entries", len(ents))
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 1 {
		t.Fatalf("the rules directory holds %v", ents)
	}
}

// TestHistoryStartingRules: the rules a directory held before the admin
// API wrote anything (those the server started with) are in the domain's
// history, and rolling back to them writes them back; so is an edit made
// outside the admin API between two of its changes. Before, the history
// began with the admin API's first change: the starting rules could not
// be rolled back to (issue 35).
func TestHistoryStartingRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	write(t, file, tenantDoc(5))
	db, err := filedb.Open(dir, rules.Loader{})
	if err != nil {
		t.Fatal(err)
	}
	ed, err := control.NewEditor(control.EditorConfig{DB: db, Now: func() time.Time { return t0 }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hist, err := ed.History(ctx, "api")
	if err != nil || len(hist) != 1 || hist[0].Version != 1 || hist[0].Text != tenantDoc(5) {
		t.Fatalf("History before any change = %+v, %v; want version 1, the file's rules", hist, err)
	}
	if _, err := ed.PutDomain(ctx, "alice", "api", []byte(tenantDoc(9)), "", false); err != nil {
		t.Fatal(err)
	}
	write(t, file, tenantDoc(11)) // outside the admin API
	if _, err := ed.PutDomain(ctx, "alice", "api", []byte(userDoc), "", false); err != nil {
		t.Fatal(err)
	}
	hist, err = ed.History(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hist {
		got = append(got, fmt.Sprintf("%d %s", h.Version, h.Author))
	}
	if want := []string{"4 alice", "3 ", "2 alice", "1 "}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("History = %q, want %q (newest first)", got, want)
	}
	if hist[3].Text != tenantDoc(5) || hist[1].Text != tenantDoc(11) {
		t.Errorf("History's versions 1 and 3 = %q, %q; want the starting rules and the edit outside", hist[3].Text, hist[1].Text)
	}
	res, err := ed.Rollback(ctx, "bob", "api", 1, "", false)
	if err != nil {
		t.Fatalf("Rollback to the starting rules: %v", err)
	}
	if res.Doc.Version != 5 {
		t.Errorf("Rollback made version %d, want 5", res.Doc.Version)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != tenantDoc(5) {
		t.Errorf("api.yaml after the rollback = %q, %v; want the starting rules", b, err)
	}
}
