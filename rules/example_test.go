package rules_test

import (
	"fmt"

	"github.com/sluicehq/sluice/rules"
)

func ExampleSet_Match() {
	s, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 30, algorithm: token_bucket, burst: 100}
    descriptors:
      - key: path
        value: /search*
        rate_limit: {unit: minute, requests_per_unit: 100, throttling: soft, exceed_percent: 10}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range [][]rules.Entry{
		{{Key: "user", Value: "alice"}},
		{{Key: "user", Value: "alice"}, {Key: "path", Value: "/search/books"}},
		{{Key: "user", Value: "alice"}, {Key: "path", Value: "/login"}},
	} {
		r, err := s.Match("api", d)
		switch {
		case err != nil:
			fmt.Println(err)
		case r == nil:
			fmt.Println(d, "not limited")
		default:
			l := r.Limits[0]
			fmt.Println(d, r.Path, l.Limit, "enforced as", l.Enforced())
		}
	}
	// Output:
	// [{user alice}] api.user 30/1s token_bucket burst=100 enforced as 30/1s token_bucket burst=100
	// [{user alice} {path /search/books}] api.user.path_/search* 100/1m0s enforced as 110/1m0s
	// [{user alice} {path /login}] not limited
}

func ExampleParse_errors() {
	_, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: -1}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}
`))
	fmt.Println(err)
	// Output:
	// rules.yaml:5: unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
	// rules.yaml:5: requests_per_unit: must be at least 0 (0 denies every request), got -1
	// rules.yaml:6: duplicate descriptor key "user" without value (first at line 4)
	// rules.yaml:7: burst: fixed_window has no burst; use token_bucket, leaky_bucket or gcra
}
