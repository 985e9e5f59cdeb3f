package rules_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// TestEditKeepsCount changes a limit's rate under a running decision
// service, as an operator does during an incident, and checks that every
// client keeps its count: raising login from 5 to 6 a minute gives a client
// that used 5 exactly one more, and setting it back to 5 keeps counting.
// Rules, decide and the memory store are the real ones; only the clock is
// injected.
func TestEditKeepsCount(t *testing.T) {
	t.Parallel()
	const five = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
`
	six := strings.Replace(five, "requests_per_unit: 5", "requests_per_unit: 6", 1)

	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC) // the start of a minute
	now := t0
	mc := memory.DefaultConfig()
	mc.Now = func() time.Time { return now }
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var cur atomic.Pointer[rules.Set]
	load := func(name, src string) {
		t.Helper()
		s, err := rules.Parse(name, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		cur.Store(s)
	}
	load("five.yaml", five)
	dc := decide.DefaultConfig()
	dc.Rules = cur.Load
	dc.Store = st
	dc.Now = func() time.Time { return now }
	dc.Logger = slog.New(slog.DiscardHandler)
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	// admitted sends n login requests of user and counts those admitted.
	admitted := func(user string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			resp, err := svc.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{
				Entries: []decide.Entry{{Key: "user", Value: user}, {Key: "path", Value: "/login"}}, Cost: 1,
			}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Mode != decide.ModeStore {
				t.Fatalf("decided in mode %v, want the store's", resp.Mode)
			}
			if resp.Overall == decide.OK {
				ok++
			}
		}
		return ok
	}

	steps := []struct {
		at    time.Duration // since t0
		rules string
		user  string
		send  int
		want  int
	}{
		{1 * time.Second, five, "alice", 5, 5},   // alice uses her 5
		{2 * time.Second, five, "bob", 2, 2},     // bob uses 2
		{10 * time.Second, six, "alice", 10, 1},  // raised to 6: alice gets exactly one more
		{11 * time.Second, six, "bob", 10, 4},    // bob has 4 left of 6
		{20 * time.Second, five, "alice", 3, 0},  // back to 5: alice has used 6
		{21 * time.Second, five, "carol", 10, 5}, // a new client gets the limit in force
		{30 * time.Second, six, "carol", 3, 1},   // and keeps her count when it is raised
		{60 * time.Second, five, "alice", 10, 5}, // the next minute starts afresh at 5
	}
	for i, s := range steps {
		now = t0.Add(s.at)
		load("step.yaml", s.rules)
		if got := admitted(s.user, s.send); got != s.want {
			t.Errorf("step %d (%v, %s sends %d): %d admitted, want %d", i, s.at, s.user, s.send, got, s.want)
		}
	}
}
