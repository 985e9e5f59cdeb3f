package rules

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzLoad parses arbitrary bytes as a rules file: it never panics, and it
// either returns Errors that each name the file, or a Set whose limits all
// validate, whose rules Match finds, and which renders as JSON.
func FuzzLoad(f *testing.F) {
	for _, pattern := range []string{"testdata/valid/*.yaml", "testdata/envoy/*.yaml", "testdata/invalid/*.yaml", "testdata/invalid/*/*.y*ml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    value: '*x*'\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1, throttling: soft, exceed_percent: 50}\n"))
	f.Add([]byte("domain: a\n---\ndomain: b\n---\n"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    rate_limits: [{unit: minute, requests_per_unit: 9, sync: lease}, {unit: hour, requests_per_unit: 9, algorithm: sliding_window, sync: async}, {unit: day, requests_per_unit: 9, algorithm: gcra, sync: lease}, {unit: second, requests_per_unit: 1, sync: soon}]\n"))
	f.Add([]byte("{domain: a, descriptors: [{key: k, rate_limits: [{unlimited: true}]}]}"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    concurrency: 20\n    priority: sheddable\n    descriptors: [{key: n, concurrency: 100001, priority: x}]\n"))
	f.Add([]byte("domain: a\ncapacity: {unit: second, requests_per_unit: 100}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic, elastic_percent: 100}\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %T %v, want Errors", err, err)
			}
			for _, e := range errs {
				if e.File != "fuzz.yaml" || e.Line < 0 || e.Msg == "" {
					t.Fatalf("malformed error %+v", e)
				}
			}
			if s != nil {
				t.Fatal("a Set beside errors")
			}
			return
		}
		checkValid(t, s)
		// The same document as Go values, decoded by the yaml package's
		// own decoder where it can, builds the same rules.
		if specs, err := decodeSpecs(data); err == nil && len(specs) == len(s.Domains()) {
			g, err := NewSet(specs...)
			if err != nil {
				t.Fatalf("NewSet of the file's specs: %v", err)
			}
			if got, want := rendered(t, g), rendered(t, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("NewSet renders\n%v\nthe file\n%v", got, want)
			}
		}
		if len(s.Domains()) == 0 {
			t.Fatal("a Set without domains")
		}
		for _, d := range s.Domains() {
			if _, err := s.Match(d, []Entry{{Key: "k", Value: "v"}, {Key: "", Value: ""}}); err != nil {
				t.Fatalf("Match(%s): %v", d, err)
			}
		}
		b, err := json.Marshal(s)
		if err != nil || !json.Valid(b) || !strings.Contains(string(b), `"domains"`) {
			t.Fatalf("JSON %s, %v", b, err)
		}
	})
}
