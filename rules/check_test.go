package rules

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// atMost returns a check that refuses limits whose rate passes n, as a
// store with a bound on its arithmetic does.
func atMost(n int64) func(sluice.Limit) error {
	return func(l sluice.Limit) error {
		if l.Rate > n {
			return fmt.Errorf("rate %d above %d: %w", l.Rate, n, sluice.ErrLimit)
		}
		return nil
	}
}

const checkRules = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
    descriptors:
      - key: path
        value: /big
        rate_limit: {unit: second, requests_per_unit: 5000}
      - key: path
        value: /soft
        rate_limit: {unit: second, requests_per_unit: 950, throttling: soft, exceed_percent: 10}
      - key: path
        value: /free
        rate_limit: {unlimited: true}
---
domain: web
descriptors:
  - key: ip
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 2000}
`

// TestCheck checks that Set.Check consults the check on every limit, the
// enforced form of a soft one included, skips unlimited ones, and reports
// each refusal at the limit's file and line.
func TestCheck(t *testing.T) {
	t.Parallel()
	set, err := Parse("rules.yaml", []byte(checkRules))
	if err != nil {
		t.Fatal(err)
	}
	var seen []sluice.Limit
	err = set.Check(func(l sluice.Limit) error { seen = append(seen, l); return nil })
	if err != nil {
		t.Fatalf("Check accepting all = %v", err)
	}
	// 100, 5000, 950 enforced as 1045 and stated as 950, 10, 2000.
	if len(seen) != 6 {
		t.Errorf("check called on %d limits %v, want 6", len(seen), seen)
	}

	err = set.Check(atMost(1000))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Check = %v, want Errors", err)
	}
	want := []string{
		"rules.yaml:8: limit 5000/1s: rate 5000 above 1000",
		"rules.yaml:11: limit 950/1s, enforced as 1045/1s by throttling: soft, exceed_percent: 10: rate 1045 above 1000",
		"rules.yaml:21: limit 2000/1m0s: rate 2000 above 1000",
	}
	if len(errs) != len(want) {
		t.Fatalf("Check = %q, want %d errors", err, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("error %d = %q, want %q", i, errs[i], w)
		}
	}

	if err := set.Check(nil); err != nil {
		t.Errorf("Check(nil) = %v", err)
	}
	if err := (*Set)(nil).Check(atMost(0)); err != nil {
		t.Errorf("nil Set: Check = %v", err)
	}
}

// TestCheckManyRefusals checks that Check reports a bounded number of
// refusals, and says how many it left out.
func TestCheckManyRefusals(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: api\ndescriptors:\n")
	for i := range 500 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 2}\n", i)
	}
	set, err := Parse("many.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var errs Errors
	if err := set.Check(atMost(1)); !errors.As(err, &errs) {
		t.Fatalf("Check = %v, want Errors", err)
	}
	if len(errs) != maxErrors || !strings.Contains(errs[len(errs)-1].Error(), "401 more limits refused") {
		t.Errorf("%d errors ending %q, want %d ending with how many more", len(errs), errs[len(errs)-1], maxErrors)
	}
}

// TestWatcherCheck checks that a Watcher with a check refuses a first
// load the check vetoes, and keeps the rules in force when a reload is
// vetoed, reporting why at file:line.
func TestWatcherCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write(t, file, rulesWithRate(5000))
	if w, err := NewWatcher(file, nil, WithCheck(atMost(1000))); err == nil {
		w.Close()
		t.Fatal("NewWatcher accepted rules the check vetoes")
	} else if !strings.Contains(err.Error(), "rules.yaml:4: limit 5000/1s: rate 5000 above 1000") {
		t.Errorf("NewWatcher = %v, want the limit's file:line and why", err)
	}

	write(t, file, rulesWithRate(10))
	ch := make(chan reload, 64)
	w, err := NewWatcher(file, func(s *Set, err error) { ch <- reload{s, err} }, WithCheck(atMost(1000)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	write(t, file, rulesWithRate(5000))
	r := next(t, ch)
	var errs Errors
	if !errors.As(r.err, &errs) || r.set != nil || !strings.Contains(r.err.Error(), "rules.yaml:4: limit 5000/1s") {
		t.Fatalf("vetoed reload: %v, %v; want Errors at rules.yaml:4", r.set, r.err)
	}
	if got := rate(t, w.Current()); got != 10 {
		t.Fatalf("after a vetoed reload: rate %d, want the old 10", got)
	}

	write(t, file, rulesWithRate(20))
	r = next(t, ch)
	if r.err != nil || rate(t, r.set) != 20 || w.Current() != r.set {
		t.Fatalf("accepted reload: %v, %v; want rate 20 in force", r.set, r.err)
	}
}
