package control_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/redisdb"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/stack"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func doc(domain string, n int64) []byte {
	return fmt.Appendf(nil, "domain: %s\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, n)
}

// openDB opens a rules database under a name of the test's own on the
// shared Redis.
func openDB(t testing.TB, addr string) *redisdb.DB {
	t.Helper()
	// The timeout only bounds a hang (a dead Redis refuses at once): at
	// 500ms, calls on a loaded machine overran it ('rules database
	// unavailable: context deadline exceeded').
	db, err := redisdb.Open("redis://"+addr, redisdb.Config{Name: "test:" + t.Name() + ":" + fmt.Sprint(time.Now().UnixNano()), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func newEditor(t testing.TB, db control.DB, now func() time.Time) *control.Editor {
	t.Helper()
	e, err := control.NewEditor(control.EditorConfig{DB: db, Now: now, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func limitOf(t *testing.T, s *rules.Set, domain string, entries ...rules.Entry) int64 {
	t.Helper()
	r, err := s.Match(domain, entries)
	if err != nil || r == nil {
		t.Fatalf("Match %s %v: %v, %v", domain, entries, r, err)
	}
	return r.Limits[0].Limit.Rate
}

func TestEditor(t *testing.T) {
	db := openDB(t, testenv.RedisAddr(t))
	ctx := context.Background()
	e := newEditor(t, db, clocktest.New(t0).Now)

	res, err := e.PutDomain(ctx, "alice", "api", doc("api", 100), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Doc.Version != 1 || res.Doc.ETag() != `"v1"` || !res.Changed || !strings.Contains(res.Diff, "+domain: api") {
		t.Fatalf("first put: %+v", res)
	}
	// Mistakes: all at once, at the submitted document's lines.
	bad := []byte("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: -3}\n")
	_, err = e.PutDomain(ctx, "alice", "api", bad, "", false)
	var es rules.Errors
	if !errors.As(err, &es) || len(es) != 2 || es[0].File != "request" || es[0].Line != 4 || es[1].Line != 6 {
		t.Fatalf("bad document: %v", err)
	}
	// Another domain than the URL's.
	if _, err := e.PutDomain(ctx, "alice", "api", doc("web", 1), "", false); !errors.Is(err, control.ErrInvalid) {
		t.Fatalf("domain mismatch: %v", err)
	}
	// A stale If-Match changes nothing.
	if _, err := e.PutDomain(ctx, "bob", "api", doc("api", 200), `"v1"`, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.PutDomain(ctx, "carol", "api", doc("api", 300), `"v1"`, false); !errors.Is(err, control.ErrConflict) {
		t.Fatalf("stale If-Match: %v", err)
	}
	cur, err := e.Domain(ctx, "api")
	if err != nil || cur.Version != 2 || cur.Author != "bob" || cur.Text != string(doc("api", 200)) {
		t.Fatalf("after a stale write: %+v, %v", cur, err)
	}
	// The same document again makes no version.
	if res, err := e.PutDomain(ctx, "bob", "api", doc("api", 200), "", false); err != nil || res.Changed || res.Doc.Version != 2 || res.Doc.Author != "bob" {
		t.Fatalf("the same document again: %+v, %v", res, err)
	}
	// A dry run writes nothing.
	if res, err := e.PutDomain(ctx, "bob", "api", doc("api", 400), "", true); err != nil || !res.DryRun || res.Doc.Version != 3 || !strings.Contains(res.Diff, "-    rate_limit: {unit: second, requests_per_unit: 200}") {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	// Rollback restores exactly the earlier version, as a new one.
	res, err = e.Rollback(ctx, "dave", "api", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ = e.Domain(ctx, "api")
	if cur.Version != 3 || cur.Text != string(doc("api", 100)) || cur.Author != "dave" || cur.Note != "rollback to version 1" {
		t.Fatalf("rollback: %+v", cur)
	}
	hist, err := e.History(ctx, "api")
	if err != nil || len(hist) != 3 || hist[0].Version != 3 || hist[2].Author != "alice" || !strings.Contains(hist[0].Diff, "+    rate_limit: {unit: second, requests_per_unit: 100}") {
		t.Fatalf("history: %+v, %v", hist, err)
	}
	if _, err := e.Rollback(ctx, "dave", "api", 9, "", false); !errors.Is(err, control.ErrNotFound) {
		t.Fatalf("rollback to a missing version: %v", err)
	}
	// Overrides: refused for no rule, set, and a domain delete keeps them valid.
	bad2 := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "user", Value: "x"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}
	if _, err := e.SetOverride(ctx, "alice", bad2, false); !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "nothing to override") {
		t.Fatalf("override without rule: %v", err)
	}
	latin1 := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "caf\xe9"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}
	if _, err := e.SetOverride(ctx, "alice", latin1, false); !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("override of a value that is not UTF-8: %v", err)
	}
	ov := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "acme"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}}
	if _, err := e.SetOverride(ctx, "alice", ov, false); err != nil {
		t.Fatal(err)
	}
	// A document that leaves the override without a rule is refused.
	if _, err := e.PutDomain(ctx, "bob", "api", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "", false); !errors.Is(err, control.ErrInvalid) {
		t.Fatalf("a put that orphans an override: %v", err)
	}
	if _, err := e.DeleteDomain(ctx, "bob", "api", "", false); !errors.Is(err, control.ErrInvalid) {
		t.Fatalf("a delete that orphans an override: %v", err)
	}
	if _, err := e.DeleteOverride(ctx, "alice", "api", ov.Entries, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DeleteDomain(ctx, "bob", "api", `"v3"`, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Domain(ctx, "api"); !errors.Is(err, control.ErrNotFound) {
		t.Fatalf("deleted domain: %v", err)
	}
	if res, err := e.PutDomain(ctx, "bob", "api", doc("api", 7), "", false); err != nil || res.Doc.Version != 5 {
		t.Fatalf("put after delete: %+v, %v", res, err)
	}
}

// TestStoreVeto: a limit the store cannot apply never enters the database.
func TestStoreVeto(t *testing.T) {
	db := openDB(t, testenv.RedisAddr(t))
	veto := func(l sluice.Limit) error {
		if l.Rate > 1000 {
			return errors.New("too many")
		}
		return nil
	}
	e, err := control.NewEditor(control.EditorConfig{DB: db, Check: veto, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 5000), "", false); err == nil || !strings.Contains(err.Error(), "request:4: limit") {
		t.Fatalf("vetoed document: %v", err)
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 10), "", false); err != nil {
		t.Fatal(err)
	}
	ov := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "acme"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5000}}}
	if _, err := e.SetOverride(ctx, "a", ov, false); err == nil || !strings.Contains(err.Error(), "too many") {
		t.Fatalf("vetoed override: %v", err)
	}
	if ovs, _ := e.Overrides(ctx); len(ovs) != 0 {
		t.Fatalf("overrides after a veto: %v", ovs)
	}
}

// TestConcurrentWriters: two writers with the same If-Match: one wins,
// the other gets ErrConflict, and the database holds the winner's.
func TestConcurrentWriters(t *testing.T) {
	db := openDB(t, testenv.RedisAddr(t))
	ctx := context.Background()
	e := newEditor(t, db, time.Now)
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 1), "", false); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		cur, _ := e.Domain(ctx, "api")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = e.PutDomain(ctx, fmt.Sprint("w", i), "api", doc("api", int64(100*round+i+2)), cur.ETag(), false)
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case errors.Is(err, control.ErrConflict):
			default:
				t.Fatalf("round %d writer %d: %v (%v)", round, i, err, errs)
			}
		}
		after, _ := e.Domain(ctx, "api")
		if won < 0 || after.Version != cur.Version+1 || after.Text != string(doc("api", int64(100*round+won+2))) {
			t.Fatalf("round %d: %v, %+v", round, errs, after)
		}
	}
}

// TestRetriever: nodes follow the database, keep their rules when it
// dies, start from their snapshot while it is down, and overrides end on
// time.
func TestRetriever(t *testing.T) {
	rs := testenv.StartRedis(t)
	db := openDB(t, rs.Addr)
	ctx := context.Background()
	clk := clocktest.New(t0)
	e := newEditor(t, db, clk.Now)
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 100), "", false); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "rules.snapshot")
	var reloads sync.Map
	r, err := control.NewRetriever(ctx, control.RetrieverConfig{DB: db, Snapshot: snap, Now: clk.Now, Poll: -1,
		OnReload: func(s *rules.Set, source string, _ int64, err error) {
			if err == nil {
				reloads.Store(source, true)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tenant := rules.Entry{Key: "tenant", Value: "acme"}
	if got := limitOf(t, r.Current(), "api", tenant); got != 100 {
		t.Fatalf("start: %d", got)
	}
	// A change is seen by notification (no polling here).
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 200), "", false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the notified change", func() bool { return limitOf(t, r.Current(), "api", tenant) == 200 })
	testenv.WaitFor(t, "the reload's report", func() bool { _, ok := reloads.Load(control.SourceNotify); return ok })
	// An override with an expiry, by the injected clock.
	ov := rules.Override{Domain: "api", Entries: []rules.Entry{tenant}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}, Expires: t0.Add(time.Hour)}
	if _, err := e.SetOverride(ctx, "a", ov, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the override", func() bool { return limitOf(t, r.Current(), "api", tenant) == 500 })
	if got := limitOf(t, r.Current(), "api", rules.Entry{Key: "tenant", Value: "other"}); got != 200 {
		t.Fatalf("another tenant: %d", got)
	}
	if next := r.Current().NextExpiry(); !next.Equal(t0.Add(time.Hour)) {
		t.Fatalf("NextExpiry %v", next)
	}
	clk.Set(t0.Add(time.Hour - time.Nanosecond))
	r.Expire()
	if got := limitOf(t, r.Current(), "api", tenant); got != 500 {
		t.Fatalf("a nanosecond before the end: %d", got)
	}
	clk.Set(t0.Add(time.Hour))
	r.Expire()
	if got := limitOf(t, r.Current(), "api", tenant); got != 200 {
		t.Fatalf("at the end: %d", got)
	}
	clk.Set(t0)
	r.Expire() // the override is in the state still: back in force before its end
	// The database dies: the node keeps its rules, writes are refused whole.
	rs.Kill()
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 300), "", false); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("write with the database down: %v", err)
	}
	if err := r.Refresh(ctx, control.SourcePoll); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("refresh with the database down: %v", err)
	}
	if got := limitOf(t, r.Current(), "api", tenant); got != 500 {
		t.Fatalf("database down: %d", got)
	}
	// A node started while it is down enforces its snapshot.
	r2, err := control.NewRetriever(ctx, control.RetrieverConfig{DB: db, Snapshot: snap, Now: clk.Now, Poll: -1, StartTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got := limitOf(t, r2.Current(), "api", tenant); got != 500 || r2.Current().Version() != r.Current().Version() {
		t.Fatalf("from the snapshot: %d, version %s vs %s", got, r2.Current().Version(), r.Current().Version())
	}
	// Without a snapshot, a node cannot start.
	if _, err := control.NewRetriever(ctx, control.RetrieverConfig{DB: db, Poll: -1, StartTimeout: time.Second}); err == nil {
		t.Fatal("started with neither database nor snapshot")
	}
	// The database is back (empty: it kept nothing): the nodes keep their
	// rules until it says otherwise. A write to the empty database is
	// generation 1, which the nodes take.
	rs.Restart()
	testenv.WaitFor(t, "the database back", func() bool {
		_, err := db.Generation(ctx)
		return err == nil
	})
	if err := r2.Refresh(ctx, control.SourcePoll); err == nil || !strings.Contains(err.Error(), "lost its data") {
		t.Fatalf("refresh from an empty database: %v", err)
	}
	if got := limitOf(t, r2.Current(), "api", tenant); got != 500 {
		t.Fatalf("after the database came back empty: %d", got)
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 42), "", false); err != nil {
		t.Fatal(err)
	}
	if err := r2.Refresh(ctx, control.SourcePoll); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, r2.Current(), "api", tenant); got != 42 {
		t.Fatalf("after the database came back: %d", got)
	}
}

// TestNodeVeto: a node whose store vetoes a limit keeps the rules in force
// when the database holds it (an editor without that veto wrote it), and
// takes the next state it can build.
func TestNodeVeto(t *testing.T) {
	db := openDB(t, testenv.RedisAddr(t))
	ctx := context.Background()
	e := newEditor(t, db, time.Now)
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 10), "", false); err != nil {
		t.Fatal(err)
	}
	veto := func(l sluice.Limit) error {
		if l.Rate > 1000 {
			return errors.New("too many for this store")
		}
		return nil
	}
	failures := make(chan error, 10)
	r, err := control.NewRetriever(ctx, control.RetrieverConfig{DB: db, Check: veto, Poll: -1,
		OnReload: func(_ *rules.Set, source string, _ int64, err error) {
			if err != nil {
				failures <- err
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tenant := rules.Entry{Key: "tenant", Value: "acme"}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 5000), "", false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failures:
		if !strings.Contains(err.Error(), "too many for this store") {
			t.Fatalf("refusal: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal reported")
	}
	if got := limitOf(t, r.Current(), "api", tenant); got != 10 {
		t.Fatalf("a vetoed set in force: %d", got)
	}
	// A blocking override (requests_per_unit 0) is taken: no store takes it.
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 20), "", false); err != nil {
		t.Fatal(err)
	}
	ov := rules.Override{Domain: "api", Entries: []rules.Entry{tenant}, Limits: []rules.RateLimitSpec{{Unit: "hour", RequestsPerUnit: 0}}}
	if _, err := e.SetOverride(ctx, "a", ov, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the blocking override", func() bool {
		rl, err := r.Current().Match("api", []rules.Entry{tenant})
		return err == nil && rl != nil && rl.Limits[0].Block
	})
	if got := limitOf(t, r.Current(), "api", rules.Entry{Key: "tenant", Value: "other"}); got != 20 {
		t.Fatalf("after the veto: %d", got)
	}
}

// TestCluster: the rules database on a Redis Cluster (every key under one
// hash tag, so each change is one script on one shard) with a node
// following it.
func TestCluster(t *testing.T) {
	addrs := testenv.RedisClusterAddrs(t)
	db, err := redisdb.Open("redis+cluster://"+strings.Join(addrs, ","), redisdb.Config{Name: fmt.Sprintf("test:cluster:%d", time.Now().UnixNano()), ClientOption: stack.ClientOption})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	e := newEditor(t, db, time.Now)
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 100), "", false); err != nil {
		t.Fatal(err)
	}
	r, err := control.NewRetriever(ctx, control.RetrieverConfig{DB: db, Poll: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tenant := rules.Entry{Key: "tenant", Value: "acme"}
	if got := limitOf(t, r.Current(), "api", tenant); got != 100 {
		t.Fatalf("start: %d", got)
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 200), `"v1"`, false); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the change through the cluster", func() bool { return limitOf(t, r.Current(), "api", tenant) == 200 })
	if hist, err := e.History(ctx, "api"); err != nil || len(hist) != 2 {
		t.Fatalf("history: %v %v", hist, err)
	}
}

// TestDomainNameGrammar: the Editor refuses a domain outside rules'
// grammar in every call that takes one, before the database; a domain
// stored before its name was refused (written to the database directly
// here) keeps the database from building until it is deleted, which the
// Editor allows.
func TestDomainNameGrammar(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, testenv.RedisAddr(t))
	e := newEditor(t, db, func() time.Time { return t0 })
	bad := "../x"
	ov := rules.Override{Domain: bad, Entries: []rules.Entry{{Key: "tenant", Value: "a"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}
	for name, call := range map[string]func() error{
		"Domain":         func() error { _, err := e.Domain(ctx, bad); return err },
		"History":        func() error { _, err := e.History(ctx, bad); return err },
		"PutDomain":      func() error { _, err := e.PutDomain(ctx, "a", bad, doc(bad, 1), "", false); return err },
		"DeleteDomain":   func() error { _, err := e.DeleteDomain(ctx, "a", bad, "", false); return err },
		"Rollback":       func() error { _, err := e.Rollback(ctx, "a", bad, 1, "", false); return err },
		"Override":       func() error { _, err := e.Override(ctx, bad, ov.Entries); return err },
		"SetOverride":    func() error { _, err := e.SetOverride(ctx, "a", ov, false); return err },
		"DeleteOverride": func() error { _, err := e.DeleteOverride(ctx, "a", bad, ov.Entries, false); return err },
	} {
		if err := call(); !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), "is not allowed") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 1), "", false); err != nil {
		t.Fatal(err)
	}
	gen, _ := db.Generation(ctx)
	old := control.Doc{Domain: "old name", Version: 1, Text: string(doc("old name", 1))}
	if _, err := db.Commit(ctx, gen, control.Change{Doc: &old}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 2), "", false); !errors.Is(err, control.ErrInvalid) || !strings.Contains(err.Error(), `domain "old name"`) {
		t.Fatalf("a put beside a stored domain of a refused name: %v", err)
	}
	if _, err := e.DeleteDomain(ctx, "a", "old name", "", false); err != nil {
		t.Fatalf("deleting the stored domain of a refused name: %v", err)
	}
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 2), "", false); err != nil {
		t.Fatalf("a put once it is deleted: %v", err)
	}
}

// TestGiganticDocument: a domain's version in the database above the cap
// on one (written there directly) is refused before it is read: the state
// read fails at once, naming it, and allocates a fraction of it. The caps
// are a few MiB here (building a value of the default's 32 MiB took Redis
// seconds).
func TestGiganticDocument(t *testing.T) {
	ctx := context.Background()
	addr := testenv.RedisAddr(t)
	name := fmt.Sprintf("gigantic:%d", time.Now().UnixNano())
	db, err := redisdb.Open("redis://"+addr, redisdb.Config{Name: name, Timeout: 10 * time.Second, MaxDocBytes: 4 << 20, MaxStateBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e := newEditor(t, db, func() time.Time { return t0 })
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 1), "", false); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Built in Redis, not sent: the value is refused for its size, before
	// it is read or decoded.
	key := "{" + name + "}:domains"
	if err := c.Do(ctx, c.B().Eval().Script("redis.call('HSET', KEYS[1], 'big', string.rep('x', tonumber(ARGV[1])))").Numkeys(1).Key(key).Arg(fmt.Sprint(6<<20)).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	defer c.Do(ctx, c.B().Del().Key(key).Build())
	// MemStats counts the allocations of the whole process, which goroutines
	// other tests left (a client's pings, a poller) add to: the fewest bytes
	// of five reads is the refused read's, within 1 MiB, where reading the
	// 6 MiB value would allocate more than that every time.
	least := uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err = db.State(ctx)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, control.ErrUnavailable) || !strings.Contains(err.Error(), `"big" holds`) {
			t.Fatalf("State: %v", err)
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if least > 1<<20 {
		t.Fatalf("the refused state read allocated %d bytes (the fewest of five reads)", least)
	}
	if _, _, err := e.Domains(ctx); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("Domains: %v", err)
	}
	if _, err := e.SetOverride(ctx, "a", rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "a"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}, false); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("SetOverride: %v", err)
	}
}

// countingDB is a rules database that counts its whole-state reads.
type countingDB struct {
	*redisdb.DB
	states int
}

func (c *countingDB) State(ctx context.Context) (*control.State, error) {
	c.states++
	return c.DB.State(ctx)
}

// TestOverrideWritesDoNotReadAll: over a DB that reads one override
// (redisdb), setting and deleting an override never reads the whole state,
// whose cost grows with the overrides (0.38 s a PUT at 1,500 overrides
// before; BenchmarkSetOverride measures it).
func TestOverrideWritesDoNotReadAll(t *testing.T) {
	ctx := context.Background()
	db := &countingDB{DB: openDB(t, testenv.RedisAddr(t))}
	e := newEditor(t, db, func() time.Time { return t0 })
	if _, err := e.PutDomain(ctx, "a", "api", doc("api", 1), "", false); err != nil {
		t.Fatal(err)
	}
	db.states = 0
	ov := rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "a"}}, Limits: []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}}
	for _, dry := range []bool{true, false} {
		if _, err := e.SetOverride(ctx, "a", ov, dry); err != nil {
			t.Fatal(err)
		}
	}
	for _, dry := range []bool{true, false} {
		if _, err := e.DeleteOverride(ctx, "a", "api", ov.Entries, dry); err != nil {
			t.Fatal(err)
		}
	}
	if db.states != 0 {
		t.Fatalf("%d whole-state reads", db.states)
	}
	if _, err := e.DeleteOverride(ctx, "a", "api", ov.Entries, false); !errors.Is(err, control.ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
	// The cap on their number holds without reading them: a third
	// override is refused, a replacement is not.
	capped, err := control.NewEditor(control.EditorConfig{DB: db, Now: func() time.Time { return t0 }, Log: quiet(), MaxOverrides: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"a", "b", "a", "c"} {
		o := ov
		o.Entries = []rules.Entry{{Key: "tenant", Value: v}}
		_, err := capped.SetOverride(ctx, "a", o, false)
		if (i < 3) != (err == nil) || i == 3 && !strings.Contains(fmt.Sprint(err), "3 overrides, more than the cap of 2") {
			t.Fatalf("override %d (%s): %v", i, v, err)
		}
	}
}
