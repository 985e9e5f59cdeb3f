package filedb

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzDecodeOverrides reads arbitrary bytes as the overrides file: it
// never panics, and what it accepts writes back as a file it reads the
// same, with every override's descriptor of 1 to 64 entries, none twice.
func FuzzDecodeOverrides(f *testing.F) {
	f.Add([]byte(`{"overrides":[{"domain":"api","entries":[{"key":"tenant","value":"acme"}],"rate_limits":[{"unit":"second","requests_per_unit":500}],"expires":"2026-11-23T13:00:00Z","author":"alice","time":"2026-11-23T12:00:00Z"}]}`))
	f.Add([]byte(`{"overrides":[]}`))
	f.Add([]byte(`{"overrides":null}`))
	f.Add([]byte(`{"overrides":[{"domain":"api","entries":[]}]}`))
	f.Add([]byte(`{"overrides":[{"domain":"a","entries":[{"key":"k","value":"v"}]},{"domain":"a","entries":[{"key":"k","value":"v"}]}]}`))
	f.Add([]byte(`{"overrides":[],"extra":1}`))
	f.Add([]byte(`{"overrides":[]} {}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ovs, err := decodeOverrides(b)
		if err != nil {
			return
		}
		keys := make([]string, len(ovs))
		for i, o := range ovs {
			if len(o.Entries) == 0 || len(o.Entries) > maxOverrideEntries {
				t.Fatalf("overrides[%d]: %d entries accepted", i, len(o.Entries))
			}
			keys[i] = o.Key()
			if slices.Contains(keys[:i], keys[i]) {
				t.Fatalf("overrides[%d]: %s twice", i, keys[i])
			}
		}
		again, err := json.Marshal(overrides{Overrides: ovs})
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeOverrides(again)
		if err != nil {
			t.Fatalf("%s written back does not read: %v", again, err)
		}
		for i := range back {
			if back[i].Key() != keys[i] || !back[i].Expires.Equal(ovs[i].Expires) || back[i].Author != ovs[i].Author {
				t.Fatalf("overrides[%d] read back as %+v, was %+v", i, back[i], ovs[i])
			}
		}
	})
}
