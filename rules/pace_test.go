package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// TestPaceWarnings checks that a window in sync: async shorter than 4 sync
// intervals is warned of at its line, and nothing else is.
func TestPaceWarnings(t *testing.T) {
	const file = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100, sync: async}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, sync: async}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100, sync: lease}
  - key: team
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, sync: async}
`
	set, err := rules.Parse("r.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     []string
	}{
		{"the default interval", 100 * time.Millisecond, nil},
		{"a second's sync", time.Second, []string{"r.yaml:4:"}},
		{"a minute's sync", time.Minute, []string{"r.yaml:4:", "r.yaml:6:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := set.PaceWarnings(tc.interval)
			if len(ws) != len(tc.want) {
				t.Fatalf("%d warnings, want %d: %v", len(ws), len(tc.want), ws)
			}
			for i, w := range ws {
				if !strings.HasPrefix(w.Error(), tc.want[i]) || !strings.Contains(w.Error(), "sync: async on a window") {
					t.Errorf("warning %d: %v, want it at %s", i, w, tc.want[i])
				}
			}
		})
	}
}
