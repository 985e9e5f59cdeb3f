package respond

import "testing"

func TestAppendSFString(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"plain", "per-user", `"per-user"`},
		{"quote and backslash", `a"b\c`, `"a\"b\\c"`},
		{"non-ASCII and control", "ü\n", `"___"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := string(appendSFString(nil, tt.in)); got != tt.want {
				t.Errorf("appendSFString(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}
