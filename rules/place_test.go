package rules

import "testing"

// TestPlace checks where a limit says it is written: file:line from a file,
// nothing for a limit no file holds (an override, a request's own limit).
func TestPlace(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		l    Limit
		want string
	}{
		{"from a file", Limit{File: "rules/api.yaml", Line: 12}, "rules/api.yaml:12"},
		{"no file", Limit{Line: 0}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.l.Place(); got != tt.want {
				t.Errorf("Place() = %q, want %q", got, tt.want)
			}
		})
	}
}
