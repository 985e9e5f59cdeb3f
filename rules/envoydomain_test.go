package rules

import (
	"strings"
	"testing"
)

// TestEnvoyDomainNames checks the names Loader.EnvoyDomainNames accepts
// beside CheckDomain's, and that a Loader without it still refuses them.
func TestEnvoyDomainNames(t *testing.T) {
	spec := func(name string) DomainSpec {
		return DomainSpec{Domain: name, Descriptors: []DescriptorSpec{{Key: "user", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}}}}
	}
	for _, tc := range []struct {
		name  string
		envoy string // "": accepted; else in the error
	}{
		{"api", ""},
		{"default/eg/http", ""},
		{"envoy-gateway-system/eg", ""},
		{"", "must not be empty"},
		{"a b", "not allowed"},
		{"a\x00b", "not allowed"},
		{strings.Repeat("x", MaxEnvoyDomainBytes+1), "at most 512"},
	} {
		_, err := Loader{EnvoyDomainNames: true}.NewSet(spec(tc.name))
		if tc.envoy == "" && err != nil || tc.envoy != "" && (err == nil || !strings.Contains(err.Error(), tc.envoy)) {
			t.Errorf("%q: %v, want %q", tc.name, err, tc.envoy)
		}
	}
	if _, err := NewSet(spec("default/eg/http")); err == nil {
		t.Error("a domain with '/' accepted without EnvoyDomainNames: it would name a file")
	}
}
