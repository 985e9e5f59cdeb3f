package observe

import (
	"hash/maphash"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/decide"
)

// TestRememberRoundTrip: a remembered descriptor comes back as it was,
// whatever its values hold (colons, digits, nothing), and one too long is
// not remembered.
func TestRememberRoundTrip(t *testing.T) {
	seed := maphash.MakeSeed()
	var c counters
	entries := []decide.Entry{{Key: "user", Value: "12:3:"}, {Key: "path", Value: ""}, {Key: "4:", Value: "/a:b"}}
	c.remember(seed, "12:3:", "api.user.path.x", entries)
	d := c.recall(seed, "12:3:")
	if d == nil || d.rule != "api.user.path.x" || !slices.Equal(unpack(d.entries), entries) || !packedEqual(d.entries, entries) {
		t.Fatalf("recall = %+v, want the descriptor %v", d, entries)
	}
	if allocs := testing.AllocsPerRun(100, func() { c.remember(seed, "12:3:", "api.user.path.x", entries) }); allocs != 0 {
		t.Errorf("remembering what the slot holds: %v allocations, want 0", allocs)
	}
	long := []decide.Entry{{Key: "user", Value: "bob"}, {Key: "path", Value: strings.Repeat("x", maxDenialBytes)}}
	c.remember(seed, "bob", "api.user.path", long)
	if d := c.recall(seed, "bob"); d != nil {
		t.Errorf("a descriptor over %d bytes remembered: %+v", maxDenialBytes, d)
	}
}
