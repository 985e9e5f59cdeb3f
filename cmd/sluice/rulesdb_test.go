package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/server"
)

// The admin tokens of the rules database tests.
const (
	testWriteSecret = "ops-secret-0123456789abcdef"
	testReadSecret  = "viewer-secret-0123456789abcdef"
)

// fleet is three `sluice serve` on one rules database.
type fleet struct {
	redis  *testenv.RedisServer
	dir    string
	tokens string
	nodes  []*testServer
	admins []string // each node's admin URL
}

func tenantDoc(n int) string {
	return fmt.Sprintf("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
}

// startNode starts node i of f with its own snapshot file.
func (f *fleet) startNode(t *testing.T, i int) *testServer {
	t.Helper()
	c := server.DefaultConfig()
	c.Rules.Source, c.Rules.Snapshot = "redis://"+f.redis.Addr, filepath.Join(f.dir, fmt.Sprintf("node%d.snapshot", i))
	c.Admin = server.AdminConfig{Tokens: f.tokens, Addr: "127.0.0.1:0"}
	s := startConfig(t, c)
	f.admins[i] = "http://" + s.adminAddr
	f.nodes[i] = s
	return s
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	f := &fleet{redis: testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always"), dir: t.TempDir(),
		nodes: make([]*testServer, 3), admins: make([]string, 3)}
	f.tokens = filepath.Join(f.dir, "tokens")
	if err := os.WriteFile(f.tokens, []byte("# who role secret\nops write "+testWriteSecret+"\nviewer read "+testReadSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range f.nodes {
		f.startNode(t, i)
	}
	return f
}

// cli runs a sluice command against node i's admin API with secret and
// returns its output.
func (f *fleet) cli(t *testing.T, i int, secret string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{args[0], args[1], "--admin-url", f.admins[i]}, args[2:]...),
		env("SLUICE_ADMIN_TOKEN="+secret), &out, &errOut)
	if err != nil {
		errOut.WriteString(err.Error())
	}
	return out.String() + errOut.String(), err
}

var requestsPerUnit = regexp.MustCompile(`"requestsPerUnit":(\d+)`)

// limit returns the limit node s enforces on tenant's requests, by a
// decision, or -1 when none applies.
func limit(t *testing.T, s *testServer, tenant string) int {
	t.Helper()
	r := s.do(t, "POST", "/v1/decide", `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"`+tenant+`"}]}]}`)
	m := requestsPerUnit.FindStringSubmatch(r.body)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func (f *fleet) allEnforce(t *testing.T, tenant string, n int) bool {
	for _, s := range f.nodes {
		if limit(t, s, tenant) != n {
			return false
		}
	}
	return true
}

// TestRulesDatabase: three nodes on one rules database enforce a change
// made through any node's admin API; overrides, history and rollback by
// the CLI; the database killed, nodes keep enforcing and writes answer
// 503; a node restarted while it is down enforces its snapshot.
func TestRulesDatabase(t *testing.T) {
	f := startFleet(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	if err := os.WriteFile(file, []byte(tenantDoc(100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "import", dir); err != nil || !strings.Contains(out, "api: is now version 1") {
		t.Fatalf("rules import: %v\n%s", err, out)
	}
	eventually(t, "every node enforcing version 1", func() bool { return f.allEnforce(t, "acme", 100) })

	// A read token changes nothing; the wrong token neither.
	writeFile(t, file, tenantDoc(1))
	if out, err := f.cli(t, 1, testReadSecret, "rules", "push", file); err == nil || !strings.Contains(out, "read-only") {
		t.Fatalf("push with a read token: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 1, "not-a-token-0123456789", "rules", "push", file); err == nil || !strings.Contains(out, "HTTP 401") {
		t.Fatalf("push with a wrong token: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 1, testReadSecret, "rules", "diff", file); err != nil || !strings.Contains(out, "+    rate_limit: {unit: hour, requests_per_unit: 1}") {
		t.Fatalf("diff with a read token: %v\n%s", err, out)
	}
	if !f.allEnforce(t, "acme", 100) {
		t.Fatal("a refused change is in force")
	}

	// One command changes a tenant's limit on the whole fleet.
	if out, err := f.cli(t, 2, testWriteSecret, "override", "set", "--limit", "500/hour", "--for", "1h", "api", "tenant=acme"); err != nil {
		t.Fatalf("override set: %v\n%s", err, out)
	}
	eventually(t, "every node enforcing the override", func() bool { return f.allEnforce(t, "acme", 500) && f.allEnforce(t, "other", 100) })
	if out, err := f.cli(t, 0, testReadSecret, "override", "list"); err != nil || !strings.Contains(out, "api tenant=acme: 500/hour, until ") || !strings.Contains(out, "set by ops") {
		t.Fatalf("override list: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "override", "delete", "api", "tenant=acme"); err != nil {
		t.Fatalf("override delete: %v\n%s", err, out)
	}
	eventually(t, "the override gone everywhere", func() bool { return f.allEnforce(t, "acme", 100) })

	// A push, the history, and the way back.
	writeFile(t, file, tenantDoc(200))
	if out, err := f.cli(t, 1, testWriteSecret, "rules", "push", "--if-match", `"v1"`, file); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	eventually(t, "every node enforcing version 2", func() bool { return f.allEnforce(t, "acme", 200) })
	if out, err := f.cli(t, 1, testWriteSecret, "rules", "push", "--if-match", `"v1"`, file); err == nil || !strings.Contains(out, "HTTP 412") {
		t.Fatalf("push with a stale --if-match: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "rollback", "api", "1"); err != nil || !strings.Contains(out, "api: is now version 3") {
		t.Fatalf("rollback: %v\n%s", err, out)
	}
	eventually(t, "every node enforcing version 1 again", func() bool { return f.allEnforce(t, "acme", 100) })
	out, err := f.cli(t, 0, testReadSecret, "rules", "history", "--diff", "api")
	if err != nil || !regexp.MustCompile(`(?s)^v3\t\S+\tops \(rollback to version 1\)\n.*v2\t\S+\tops\n.*v1\t\S+\tops\n`).MatchString(out) {
		t.Fatalf("history: %v\n%s", err, out)
	}
	if got, err := f.cli(t, 0, testReadSecret, "rules", "get", "api"); err != nil || !strings.HasSuffix(got, tenantDoc(100)) {
		t.Fatalf("get after rollback: %v\n%s", err, got)
	}
	// Each node says what it has in force, and the admin calls it served.
	eventually(t, "the metrics", func() bool {
		m := f.nodes[1].do(t, "GET", "/metrics", "").body
		return strings.Contains(m, "sluice_rules_generation 5") && strings.Contains(m, `sluice_rules_source_reloads_total{result="success",source="notify"}`) &&
			strings.Contains(m, "sluice_rules_overrides 0") && strings.Contains(m, `sluice_admin_requests_total{code="403",token="viewer"} 1`) &&
			strings.Contains(m, `sluice_admin_requests_total{code="401",token=""} 1`)
	})

	// Propagation: 100 changes through node 0, each waited for on all three.
	var lat []time.Duration
	for i := range 100 {
		n := 1000 + i
		start := time.Now()
		r := f.put(t, 0, tenantDoc(n))
		if r != 200 {
			t.Fatalf("PUT %d: %d", i, r)
		}
		// Asked again at once, not every 20ms, for the figure's sake.
		for !f.allEnforce(t, "acme", n) {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("change %d not on every node within 10s", i)
			}
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	// The figure (issue 19's p99 < 1s) is reported, not asserted: a timed
	// assertion fails on a loaded machine (p99 1.41s in a CI-like run with
	// other tests beside it). A change that never arrives fails above.
	t.Logf("propagation over 100 changes (PUT sent to all three nodes enforcing): p50 %v, p99 %v, max %v", p50, p99, lat[len(lat)-1])

	// The database killed: nodes keep enforcing, writes answer 503.
	last := 1099
	f.redis.Kill()
	if code := f.put(t, 1, tenantDoc(7)); code != 503 {
		t.Fatalf("PUT with the database down: %d", code)
	}
	if !f.allEnforce(t, "acme", last) {
		t.Fatal("the rules in force changed with the database down")
	}
	// A node restarted while the database is down enforces its snapshot.
	if err := f.nodes[2].stop(); err != nil {
		t.Fatal(err)
	}
	s := f.startNode(t, 2)
	if rec := s.logs.Find("rules reloaded"); rec == nil || rec["source"] != "snapshot" {
		t.Fatalf("restarted node's first load: %v\n%s", rec, s.logs)
	}
	if got := limit(t, s, "acme"); got != last {
		t.Fatalf("restarted node enforces %d, want %d", got, last)
	}
	// The database back: it holds the last good version, whole.
	f.redis.Restart()
	var cur string
	eventually(t, "the database answering", func() bool {
		var err error
		cur, err = f.cli(t, 0, testReadSecret, "rules", "get", "api")
		return err == nil
	})
	if !strings.HasSuffix(cur, tenantDoc(last)) || !strings.Contains(cur, `"v103"`) {
		t.Fatalf("after the restart: %s", cur)
	}
	eventually(t, "node 1 reading the database again", func() bool {
		_, err := f.cli(t, 1, testReadSecret, "rules", "get", "api")
		return err == nil
	})
	if code := f.put(t, 1, tenantDoc(8)); code != 200 {
		t.Fatalf("PUT with the database back: %d", code)
	}
	eventually(t, "every node enforcing the change after the outage", func() bool { return f.allEnforce(t, "acme", 8) })
}

// put sends a PUT of domain api's document to node i's admin API and
// returns the status.
func (f *fleet) put(t *testing.T, i int, doc string) int {
	t.Helper()
	ac := &adminClient{base: f.admins[i], secret: testWriteSecret, http: f.nodes[i].http}
	_, _, err := ac.do(context.Background(), "PUT", "/v1/admin/domains/api", []byte(doc))
	if err == nil {
		return 200
	}
	if e, ok := err.(*apiError); ok {
		t.Logf("PUT to node %d: %v", i, e)
		return e.code
	}
	t.Fatal(err)
	return 0
}

// TestAdminOverFiles: with rules in a directory, the admin API writes the
// domain's file atomically, the watcher puts it in force, history and
// rollback work, overrides set, listed and deleted by the CLI are kept in
// the directory and enforced (by a node started on it later too), and
// --admin-read-only writes nothing.
func TestAdminOverFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(tenantDoc(100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.yaml"), []byte("domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: mail\ndescriptors:\n  - key: to\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ops write "+testWriteSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &fleet{nodes: make([]*testServer, 1), admins: make([]string, 1)}
	c := server.DefaultConfig()
	c.Rules.Source, c.Admin = dir, server.AdminConfig{Tokens: tokens, Addr: "127.0.0.1:0"}
	s := startConfig(t, c)
	f.nodes[0], f.admins[0] = s, "http://"+s.adminAddr
	if got := limit(t, s, "acme"); got != 100 {
		t.Fatalf("start: %d", got)
	}
	file := filepath.Join(t.TempDir(), "api.yaml")
	writeFile(t, file, tenantDoc(300))
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", file); err != nil || !strings.Contains(out, "api: is now version 2") {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "api.yaml")); err != nil || string(b) != tenantDoc(300) {
		t.Fatalf("the file: %q, %v", b, err)
	}
	eventually(t, "the pushed file in force", func() bool { return limit(t, s, "acme") == 300 })
	// The rules the server started with are version 1 of the history,
	// and can be rolled back to (issue 35: they were not, HTTP 404).
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "rollback", "api", "1"); err != nil || !strings.Contains(out, "api: is now version 3") {
		t.Fatalf("rollback to the rules the server started with: %v\n%s", err, out)
	}
	eventually(t, "the starting rules in force again", func() bool { return limit(t, s, "acme") == 100 })
	writeFile(t, file, tenantDoc(400))
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", "--if-match", `"v3"`, file); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "rollback", "api", "2"); err != nil || !strings.Contains(out, "api: is now version 5") {
		t.Fatalf("rollback: %v\n%s", err, out)
	}
	eventually(t, "the rollback in force", func() bool { return limit(t, s, "acme") == 300 })
	// A domain of a file the API does not own is refused.
	writeFile(t, file, strings.ReplaceAll(tenantDoc(1), "api", "web"))
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", file); err == nil || !strings.Contains(out, `domain "web" is in other.yaml`) {
		t.Fatalf("push of web: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "web.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("web.yaml: %v", err)
	}
	// Overrides: kept beside the files, enforced at once, on the rules
	// the files hold.
	if out, err := f.cli(t, 0, testWriteSecret, "override", "set", "--limit", "5/hour", "api", "tenant=acme"); err != nil || !strings.Contains(out, "api tenant=acme: 5/hour, no expiry, set by ops") {
		t.Fatalf("override set: %v\n%s", err, out)
	}
	eventually(t, "the override in force", func() bool { return limit(t, s, "acme") == 5 })
	if got := limit(t, s, "other"); got != 300 {
		t.Fatalf("another tenant beside the override: %d", got)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "override", "set", "--limit", "7/second", "api", "ip=1.2.3.4"); err == nil || !strings.Contains(out, "no rule with limits matches") {
		t.Fatalf("override for no rule: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "override", "set", "--limit", "9/hour", "--for", "1h", "api", "tenant=bolt"); err != nil {
		t.Fatalf("override set: %v\n%s", err, out)
	}
	eventually(t, "the second override in force", func() bool { return limit(t, s, "bolt") == 9 })
	if out, err := f.cli(t, 0, testWriteSecret, "override", "list"); err != nil || !strings.Contains(out, "api tenant=acme: 5/hour, no expiry, set by ops") ||
		!strings.Contains(out, "api tenant=bolt: 9/hour, until ") {
		t.Fatalf("override list: %v\n%s", err, out)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "override", "delete", "api", "tenant=bolt"); err != nil {
		t.Fatalf("override delete: %v\n%s", err, out)
	}
	eventually(t, "the deleted override gone", func() bool { return limit(t, s, "bolt") == 300 })
	if b, err := os.ReadFile(filepath.Join(dir, ".sluice-admin", "overrides.json")); err != nil || !strings.Contains(string(b), `"value":"acme"`) || strings.Contains(string(b), "bolt") {
		t.Fatalf("overrides.json: %s, %v", b, err)
	}
	// An edit of the file by hand: the override stays on the new rules.
	writeFile(t, filepath.Join(dir, "api.yaml"), tenantDoc(350))
	eventually(t, "the edited file in force", func() bool { return limit(t, s, "other") == 350 })
	if got := limit(t, s, "acme"); got != 5 {
		t.Fatalf("the override after an edit of the file: %d", got)
	}
	writeFile(t, filepath.Join(dir, "api.yaml"), tenantDoc(300))
	eventually(t, "the file back", func() bool { return limit(t, s, "other") == 300 })
	// Read-only: nothing is written.
	c.Admin.ReadOnly = true
	ro := startConfig(t, c)
	f.nodes[0], f.admins[0] = ro, "http://"+ro.adminAddr
	if got := limit(t, ro, "acme"); got != 5 {
		t.Fatalf("a node started on the directory: acme %d, want its override", got)
	}
	if out, err := f.cli(t, 0, testWriteSecret, "override", "delete", "api", "tenant=acme"); err == nil || !strings.Contains(out, "read-only") {
		t.Fatalf("override delete on a read-only API: %v\n%s", err, out)
	}
	writeFile(t, file, tenantDoc(1))
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", file); err == nil || !strings.Contains(out, "read-only") {
		t.Fatalf("push to a read-only API: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "api.yaml")); string(b) != tenantDoc(300) {
		t.Fatalf("the file after a read-only push: %q", b)
	}
}

// TestRulesGetPushRoundTrip: what `sluice rules get` prints, pushed back
// unchanged, changes nothing, and its header comment is not stored: a
// round trip does not add a comment each time (issue 24.4).
func TestRulesGetPushRoundTrip(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "api.yaml"), "# the API's limits\n"+tenantDoc(100))
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, tokens, "ops write "+testWriteSecret+"\n")
	c := server.DefaultConfig()
	c.Rules.Source, c.Admin = dir, server.AdminConfig{Tokens: tokens, Addr: "127.0.0.1:0"}
	s := startConfig(t, c)
	f := &fleet{nodes: []*testServer{s}, admins: []string{"http://" + s.adminAddr}}
	file := filepath.Join(t.TempDir(), "api.yaml")
	get := func() string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"rules", "get", "--admin-url", f.admins[0], "api"},
			env("SLUICE_ADMIN_TOKEN="+testWriteSecret), &out, &errOut); err != nil {
			t.Fatalf("rules get: %v\n%s", err, errOut.String())
		}
		return out.String()
	}
	first := get()
	for round := range 2 {
		writeFile(t, file, get())
		if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", file); err != nil || !strings.Contains(out, "api: unchanged") {
			t.Fatalf("round %d: push of what get printed: %v\n%s", round, err, out)
		}
	}
	if got := get(); got != first {
		t.Errorf("get after two round trips:\n%s\nwant what it printed first:\n%s", got, first)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "api.yaml")); err != nil || string(b) != "# the API's limits\n"+tenantDoc(100) {
		t.Errorf("the rules file: %q, %v; want it as written", b, err)
	}
	// An edit of what get printed is pushed without get's header.
	writeFile(t, file, strings.Replace(get(), "100", "200", 1))
	if out, err := f.cli(t, 0, testWriteSecret, "rules", "push", file); err != nil || !strings.Contains(out, "api: is now version") {
		t.Fatalf("push of an edit: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "api.yaml")); err != nil || string(b) != "# the API's limits\n"+tenantDoc(200) {
		t.Errorf("the rules file after an edit: %q, %v", b, err)
	}
}
