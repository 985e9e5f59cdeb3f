package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestNameGroup checks the Redis keys a request's Group makes: every key
// of one group has the group's slot whatever the key and the group hold
// (braces included), keys without a group keep their own, and the tag is
// the key's first brace pair.
func TestNameGroup(t *testing.T) {
	t.Parallel()
	s := &Store{cfg: DefaultConfig()}
	groups := []string{"|5:alice", "{", "}", "}{", "{}", "a}b{c", "{x}", strings.Repeat("z", 5000)}
	keys := []string{"k", "{other}k", "}", "3f2a9c01d4e5b6a7|5:alice", ""}
	slots := map[uint16]string{}
	for _, g := range groups {
		want := Slot(s.name(keys[0], g))
		for _, k := range keys {
			name := s.name(k, g)
			if got := Slot(name); got != want {
				t.Errorf("group %.20q: key %q in slot %d, key %q in slot %d", g, keys[0], want, k, got)
			}
			if !strings.HasPrefix(name, s.cfg.KeyPrefix+"{") || strings.IndexByte(name, '}') != len(s.cfg.KeyPrefix)+9 {
				t.Errorf("group %.20q, key %q: name %q does not start with a tag of 8 digits", g, k, name)
			}
			if !strings.HasSuffix(name, k) {
				t.Errorf("name %q does not end with its key %q", name, k)
			}
		}
		slots[want] = g
	}
	if len(slots) < len(groups)-1 { // 8 groups in 16,384 slots: one pair may meet
		t.Errorf("%d groups in only %d slots", len(groups), len(slots))
	}
	if got, want := s.name("{t}k", ""), s.cfg.KeyPrefix+"{t}k"; got != want {
		t.Errorf("no group: name %q, want %q", got, want)
	}
}

// TestGroupOneState checks that a key with a group names one state however
// it is decided: a TakeAll of several requests, or of one (which takes
// another path), and that different groups keep different states.
func TestGroupOneState(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clock := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clock.Now))
			ctx := context.Background()
			lim := sluice.Limit{Rate: 3, Period: time.Minute}
			take := func(reqs ...sluice.Request) []sluice.Decision {
				t.Helper()
				ds := make([]sluice.Decision, len(reqs))
				if err := s.TakeAll(ctx, reqs, ds); err != nil {
					t.Fatalf("TakeAll: %v", err)
				}
				return ds
			}
			a := sluice.Request{Key: "a", Group: "client}{1", Limit: lim, Cost: 1}
			b2 := sluice.Request{Key: "b", Group: a.Group, Limit: lim, Cost: 1}
			take(a, b2)
			if d := take(a)[0]; !d.Allowed || d.Remaining != 1 {
				t.Fatalf("alone after a pair: %+v, want allowed with 1 remaining", d)
			}
			if d := take(b2, a)[1]; !d.Allowed || d.Remaining != 0 {
				t.Fatalf("in a pair again: %+v, want allowed with 0 remaining", d)
			}
			if d := take(a)[0]; d.Allowed {
				t.Fatalf("a fourth hit of 3 a minute: %+v, want denied", d)
			}
			other := a
			other.Group = "client}{2"
			if d := take(other)[0]; !d.Allowed || d.Remaining != 2 {
				t.Fatalf("same key in another group: %+v, want a fresh state", d)
			}
		})
	}
}
