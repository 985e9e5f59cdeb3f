package rules_test

import (
	"fmt"
	"time"

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

func ExampleNewSet() {
	s, err := rules.NewSet(rules.DomainSpec{
		Domain: "api",
		Descriptors: []rules.DescriptorSpec{{
			Key:       "user",
			RateLimit: &rules.RateLimitSpec{Unit: "second", RequestsPerUnit: 30, Algorithm: "token_bucket", Burst: 100},
			Descriptors: []rules.DescriptorSpec{{
				Key: "path", Value: "/login",
				RateLimits: []rules.RateLimitSpec{{Unit: "minute", RequestsPerUnit: 5}, {Unit: "hour", RequestsPerUnit: 0}},
			}},
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	r, _ := s.Match("api", []rules.Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/login"}})
	for _, l := range r.Limits {
		fmt.Println(r.Path, l.Limit.Period, "block:", l.Block)
	}

	_, err = rules.NewSet(rules.DomainSpec{Domain: "api", Descriptors: []rules.DescriptorSpec{
		{Key: "user", RateLimit: &rules.RateLimitSpec{Unit: "fortnight", RequestsPerUnit: 5}},
	}})
	fmt.Println(err)
	// Output:
	// api.user.path_/login 1m0s block: false
	// api.user.path_/login 1h0m0s block: true
	// api/user/rate_limit: unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
}

func ExampleSet_WithOverrides() {
	s, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	s, err = s.WithOverrides(now, rules.Override{
		Domain:  "api",
		Entries: []rules.Entry{{Key: "tenant", Value: "acme"}},
		Limits:  []rules.RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}},
		Expires: now.Add(time.Hour),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tenant := range []string{"acme", "globex"} {
		r, _ := s.Match("api", []rules.Entry{{Key: "tenant", Value: tenant}})
		fmt.Println(tenant, r.Limits[0].Limit, "override:", r.Overrides != nil)
	}
	fmt.Println("next expiry:", s.NextExpiry().Format(time.TimeOnly))
	// Output:
	// acme 500/1s override: true
	// globex 100/1s override: false
	// next expiry: 13:00:00
}
