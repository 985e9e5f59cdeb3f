package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

func TestParseLimit(t *testing.T) {
	for _, c := range []struct {
		in, unit string
		n        int64
		bad      bool
	}{
		{in: "500/second", unit: "second", n: 500},
		{in: "500/s", unit: "second", n: 500},
		{in: "0/h", unit: "hour", n: 0},
		{in: "7/day", unit: "day", n: 7},
		{in: "5/fortnight", unit: "fortnight", n: 5}, // the server names the unit's mistake
		{in: "500", bad: true},
		{in: "-1/s", bad: true},
		{in: "x/s", bad: true},
		{in: "", bad: true},
		{in: "5/", bad: true},
	} {
		ls, err := parseLimit(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("%q: accepted %+v", c.in, ls)
			}
			continue
		}
		if err != nil || ls.Unit != c.unit || ls.RequestsPerUnit != c.n {
			t.Errorf("%q: %+v, %v", c.in, ls, err)
		}
	}
	es, err := parseEntries([]string{"tenant=acme", "path=/a=b", "empty="})
	if err != nil || len(es) != 3 || es[1].Value != "/a=b" || es[2].Value != "" {
		t.Fatalf("parseEntries: %+v, %v", es, err)
	}
	for _, bad := range []string{"tenant", "=x"} {
		if _, err := parseEntries([]string{bad}); err == nil {
			t.Errorf("parseEntries(%q) accepted", bad)
		}
	}
}

// FuzzParseLimit: what parseLimit accepts reads back as it was written.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"500/second", "0/h", "1/", "/s", "9223372036854775807/day"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := parseLimit(s)
		if err != nil {
			return
		}
		if ls.RequestsPerUnit < 0 || ls.Unit == "" {
			t.Fatalf("%q: accepted %+v", s, ls)
		}
		again, err := parseLimit(strconv.FormatInt(ls.RequestsPerUnit, 10) + "/" + ls.Unit)
		if err != nil || again.Unit != ls.Unit || again.RequestsPerUnit != ls.RequestsPerUnit {
			t.Fatalf("%q: %+v reads back as %+v, %v", s, ls, again, err)
		}
	})
}

// TestLimitHelpUnits: --limit's help names every unit a rules file takes,
// and the short ones parseLimit reads (its help named four of seven).
func TestLimitHelpUnits(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"override", "set", "--help"}, env(), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	// The flag's lines: from --limit to the next flag.
	help, in := "", false
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			in = strings.HasPrefix(strings.TrimSpace(line), "--limit ")
		}
		if in {
			help += line + "\n"
		}
	}
	for _, unit := range []string{"millisecond", "second", "minute", "hour", "day", "week", "fortnight", "month", "quarter", "year", "s", "m", "h", "d"} {
		ls, err := parseLimit("5/" + unit)
		if err != nil {
			continue
		}
		doc := fmt.Sprintf("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: %s, requests_per_unit: 5}\n", ls.Unit)
		if _, err := rules.Parse("r.yaml", []byte(doc)); err != nil {
			continue
		}
		if !regexp.MustCompile(`\b` + unit + `\b`).MatchString(help) {
			t.Errorf("--limit takes 5/%s, but its help does not name %s: %q", unit, unit, help)
		}
	}
}
