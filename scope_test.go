package sluice

import "testing"

func TestScope(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Scope
	}{{"", RegionScope}, {"region", RegionScope}, {"global", GlobalScope}} {
		got, err := ParseScope(tc.name)
		if err != nil || got != tc.want {
			t.Errorf("ParseScope(%q) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
		if tc.name != "" && got.String() != tc.name {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.name)
		}
	}
	if _, err := ParseScope("planet"); err == nil {
		t.Error("ParseScope(planet) accepted")
	}
}
