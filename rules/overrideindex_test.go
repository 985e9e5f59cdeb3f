package rules

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// indexOf builds an overrideIndex of descs, the override of descs[i]
// taking a rule of its own whose Key is its index, with every
// descriptor's hash replaced by hash(seed) when hash is not nil.
func indexOf(descs [][]Entry, hash func(*overrideBuilder) uint64) *overrideIndex {
	b := newOverrideBuilder()
	for i, d := range descs {
		b.add(d, overrideRuleKey{limits: string(rune('a' + i))}, &Rule{Key: string(rune('a' + i))}, i, time.Time{})
	}
	if hash != nil {
		for i := range b.hash {
			b.hash[i] = hash(b)
		}
	}
	return b.index()
}

// TestOverrideIndex checks that the index finds exactly the descriptors
// given to it: the whole descriptor, key and value apart (no two
// descriptors that write the same bytes end to end are confused), of
// strings long enough to take several bytes of length, and that a
// descriptor whose hash equals another's is told apart by its entries.
func TestOverrideIndex(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("v", 300)
	descs := [][]Entry{
		entries("tenant", "acme"),
		entries("tenant", "acme", "user", "bob"),
		entries("ab", "c"),
		entries("k", ""),
		entries("", "v"),
		entries("long", long),
		entries(strings.Repeat("k", 128), "x", "y", long),
	}
	others := [][]Entry{
		nil,
		entries("tenant", "acm"),
		entries("tenant", "acme", "user", "bo"),
		entries("user", "bob"),
		entries("tenant", "acme", "user", "bob", "path", "/"),
		entries("a", "bc"),
		entries("abc", ""),
		entries("k", "", "", ""),
		entries("", ""),
		entries("long", long+"v"),
		entries("long", long[1:]),
		entries(strings.Repeat("k", 127), "x", "y", long),
	}
	check := func(t *testing.T, x *overrideIndex) {
		t.Helper()
		for i, d := range descs {
			if r := x.lookup(d); r == nil || r.Key != string(rune('a'+i)) {
				t.Errorf("lookup(%s) = %v, want the rule of override %d", entriesString(d), r, i)
			}
		}
		for _, d := range others {
			if r := x.lookup(d); r != nil {
				t.Errorf("lookup(%s) = the rule of override %q, want none", entriesString(d), r.Key)
			}
		}
	}
	t.Run("hashes", func(t *testing.T) { check(t, indexOf(descs, nil)) })
	// Every descriptor with the hash of one of them, then of one that
	// is not there: the entries tell them apart.
	for _, q := range [][]Entry{descs[1], descs[5], others[3]} {
		t.Run("collisions/"+entriesString(q), func(t *testing.T) {
			x := indexOf(descs, func(b *overrideBuilder) uint64 { return hashEntries(b.x.seed, q) })
			for i, d := range descs {
				r := x.lookup(d)
				if slices.Equal(d, q) && (r == nil || r.Key != string(rune('a'+i))) {
					t.Errorf("lookup(%s) = %v among equal hashes, want the rule of override %d", entriesString(d), r, i)
				}
			}
			if !slices.ContainsFunc(descs, func(d []Entry) bool { return slices.Equal(d, q) }) {
				if r := x.lookup(q); r != nil {
					t.Errorf("lookup(%s) = the rule of override %q, whose hash alone is the same", entriesString(q), r.Key)
				}
			}
		})
	}
	for _, d := range append(slices.Clone(descs), others[1:]...) {
		if got := decodeEntries(string(appendEntries(nil, d))); !slices.Equal(got, d) {
			t.Errorf("decodeEntries(appendEntries(%s)) = %s", entriesString(d), entriesString(got))
		}
	}
}

// FuzzOverrideIndex indexes one descriptor of one or two entries and
// looks up another: found exactly when they are equal; and a descriptor
// reads back as itself from its encoding.
func FuzzOverrideIndex(f *testing.F) {
	f.Add("tenant", "acme", "", "", 1, "tenant", "acme", "", "", 1)
	f.Add("ab", "c", "", "", 1, "a", "bc", "", "", 1)
	f.Add("k", "", "", "", 2, "k", "", "", "", 1)
	f.Add("k", strings.Repeat("x", 200), "u", "v", 2, "k", strings.Repeat("x", 200), "u", "v", 2)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, n1 int, k3, v3, k4, v4 string, n2 int) {
		desc := func(n int, kv ...string) []Entry {
			return entries(kv...)[:min(max(n, 0), 2)]
		}
		a, b := desc(n1, k1, v1, k2, v2), desc(n2, k3, v3, k4, v4)
		if len(a) == 0 {
			return
		}
		x := indexOf([][]Entry{a}, nil)
		if r := x.lookup(b); (r != nil) != slices.Equal(a, b) {
			t.Errorf("index of %s: lookup(%s) = %v", entriesString(a), entriesString(b), r)
		}
		if got := decodeEntries(string(appendEntries(nil, b))); !slices.Equal(got, b) && len(b) > 0 {
			t.Errorf("decodeEntries(appendEntries(%s)) = %s", entriesString(b), entriesString(got))
		}
	})
}
