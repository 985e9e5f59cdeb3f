package identity_test

import (
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/identity"
)

// BenchmarkDescriptors produces two descriptors from the client's address
// (one with a second, constant entry), as the proxy does per request.
func BenchmarkDescriptors(b *testing.B) {
	id, err := identity.New(identity.Config{Domain: "bench", TrustedProxies: []string{"127.0.0.1"},
		RateLimits: []identity.RateLimit{
			{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}},
			{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}, {GenericKey: &identity.GenericKey{DescriptorValue: "x"}}}},
		}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "127.0.0.1:54321"
	b.ReportAllocs()
	for b.Loop() {
		id.Descriptors(r)
	}
}
