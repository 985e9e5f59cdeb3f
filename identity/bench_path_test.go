package identity_test

import (
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/identity"
)

// BenchmarkDescriptorsPath produces a per-client descriptor and a
// per-path one (path and method), as a rules file with path limits
// needs, behind a trusted proxy that sets X-Forwarded-For.
func BenchmarkDescriptorsPath(b *testing.B) {
	id, err := identity.New(identity.Config{Domain: "bench", TrustedProxies: []string{"127.0.0.1"},
		RateLimits: []identity.RateLimit{
			{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}},
			{Actions: []identity.Action{{Path: &identity.PathAction{Prefix: "/v1/"}}, {Method: &identity.MethodAction{}}}},
		}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/messages/send", nil)
	r.RemoteAddr = "127.0.0.1:54321"
	r.Header.Set("X-Forwarded-For", "198.51.100.7")
	b.ReportAllocs()
	for b.Loop() {
		id.Descriptors(r)
	}
}
