package envoykeys

import (
	"testing"

	"github.com/sluicehq/sluice"
)

// TestKey checks the layout of Envoy's counter keys, its collisions kept
// on purpose (Envoy's ratelimit joins keys and values as they are), and
// that a key costs one allocation (not parallel: AllocsPerRun).
func TestKey(t *testing.T) {
	s := &Store{prefix: "pfx_"}
	for _, tc := range []struct {
		d    sluice.Descriptor
		want string
	}{
		{sluice.Descriptor{Domain: "api", Entries: []sluice.Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/login"}}}, "pfx_api_user_alice_path_/login_1763856000"},
		{sluice.Descriptor{Domain: "api", Entries: []sluice.Entry{{Key: "a", Value: "b_c"}}}, "pfx_api_a_b_c_1763856000"},
		{sluice.Descriptor{Domain: "api", Entries: []sluice.Entry{{Key: "a_b", Value: "c"}}}, "pfx_api_a_b_c_1763856000"},
		{sluice.Descriptor{Domain: "api"}, "pfx_api_1763856000"},
	} {
		if got := s.key(&tc.d, 1763856000); got != tc.want {
			t.Errorf("key(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	d := sluice.Descriptor{Domain: "api", Entries: []sluice.Entry{{Key: "user", Value: "alice"}}}
	if n := testing.AllocsPerRun(100, func() { s.key(&d, 1763856000) }); n != 1 {
		t.Errorf("key: %v allocations, want 1", n)
	}
}
