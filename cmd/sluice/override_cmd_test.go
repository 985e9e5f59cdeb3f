package main

import (
	"strconv"
	"testing"
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
