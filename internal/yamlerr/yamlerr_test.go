package yamlerr

import (
	"errors"
	"testing"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  string
		line int
		msg  string
	}{
		{"line", "yaml: line 3: did not find expected key", 3, "invalid YAML: did not find expected key"},
		{"no line", "yaml: control characters are not allowed", 0, "invalid YAML: control characters are not allowed"},
		{"line not a number", "yaml: line x: odd", 0, "invalid YAML: line x: odd"},
		{"no prefix", "unexpected EOF", 0, "invalid YAML: unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line, msg := Split(errors.New(tt.err))
			if line != tt.line || msg != tt.msg {
				t.Errorf("Split(%q) = %d, %q; want %d, %q", tt.err, line, msg, tt.line, tt.msg)
			}
		})
	}
}
