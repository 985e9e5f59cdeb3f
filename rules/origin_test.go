package rules

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestOrigin checks that a Set's origin shows in its JSON and that the Set
// it was made from is unchanged.
func TestOrigin(t *testing.T) {
	s, err := NewSet(DomainSpec{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}}}})
	if err != nil {
		t.Fatal(err)
	}
	o := s.WithOrigin(Origin{Source: "xds://eg:18001", Version: "7"})
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"origin":{"source":"xds://eg:18001","version":"7"}`) {
		t.Errorf("JSON %s: no origin", b)
	}
	if s.Origin() != nil || o.Version() != s.Version() || len(o.Domains()) != 1 {
		t.Errorf("origin %v, versions %s %s", s.Origin(), o.Version(), s.Version())
	}
	if b, _ := json.Marshal(s); strings.Contains(string(b), "origin") {
		t.Errorf("JSON without an origin: %s", b)
	}
}
