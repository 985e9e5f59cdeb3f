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

// TestGlobalWarnings: a limit of scope global whose window (a bucket's:
// its count's, capacity × period / rate) spans too few rounds is warned
// of, with the share of the limit its regions can use; one of scope
// region, or a long enough window, is not.
func TestGlobalWarnings(t *testing.T) {
	const file = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100, scope: global}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, scope: global}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: team
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 100, scope: global}
`
	set, err := rules.Parse("r.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	ws := set.GlobalWarnings(100*time.Millisecond, 10)
	if len(ws) != 1 || !strings.HasPrefix(ws[0].Error(), "r.yaml:4:") || !strings.Contains(ws[0].Error(), "at most 65% of the limit is usable") {
		t.Errorf("warnings %v: want r.yaml:4 alone, 65%% usable", ws)
	}
	if ws := set.GlobalWarnings(time.Second, 10); len(ws) != 2 {
		t.Errorf("rounds of a second: %v, want r.yaml:4 and r.yaml:10", ws)
	}
}

// TestGlobalCountReadable: a limit of scope global whose count a region
// cannot read exactly (rate × period of µs at 2^52 or more: 2,000,000 an
// hour) is refused with its file and line; before, every round's read of
// the region's own counts failed on it, and every global key went without
// a cap. The same limit of scope region loads.
func TestGlobalCountReadable(t *testing.T) {
	const file = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2000000, scope: global}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 2000000}
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 1000000, scope: global}
`
	_, err := rules.Parse("r.yaml", []byte(file))
	if err == nil || !strings.Contains(err.Error(), "r.yaml:4:") || strings.Contains(err.Error(), "r.yaml:6:") || strings.Contains(err.Error(), "r.yaml:8:") {
		t.Errorf("parse: %v; want r.yaml:4 alone refused", err)
	}
}
