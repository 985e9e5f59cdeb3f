package xds

import (
	"testing"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzBuild feeds build resources of any bytes: a management server's
// response is input. It must refuse or build, never panic, and a Set it
// builds has the domains of the resources.
func FuzzBuild(f *testing.F) {
	for _, rc := range []*rlconf.RateLimitConfig{
		{Name: "api", Domain: "api", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "user", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_SECOND, RequestsPerUnit: 5}}}},
		{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "r", Value: "r",
			Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlconf.RateLimitPolicy{Unlimited: true}}}}}},
		{Domain: "x", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlconf.RateLimitPolicy{Unit: 9, RequestsPerUnit: 1,
			Name: "a", Replaces: []*rlconf.RateLimitReplace{{Name: "a"}}}, ShadowMode: true, DetailedMetric: true}}},
	} {
		b, err := proto.Marshal(rc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	c := Config{}
	c.Loader.EnvoyDomainNames = true
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := c.build([]*anypb.Any{{TypeUrl: TypeURL, Value: data}})
		if err != nil {
			return
		}
		var rc rlconf.RateLimitConfig
		if err := proto.Unmarshal(data, &rc); err != nil {
			t.Fatalf("built a Set from bytes that do not decode: %v", err)
		}
		if d := set.Domains(); len(d) != 1 || d[0] != rc.GetDomain() {
			t.Fatalf("domains %v, want [%s]", d, rc.GetDomain())
		}
	})
}
