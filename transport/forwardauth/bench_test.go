package forwardauth_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/transport/forwardauth"
)

// nopWriter is a ResponseWriter that keeps headers and discards the rest,
// so that the benchmark measures the handler rather than a recorder.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkHandler measures one forward-auth decision: rebuilding the
// original request, its descriptors, the decision on the memory store, and
// the fields of the answer.
func BenchmarkHandler(b *testing.B) {
	h, err := forwardauth.New(forwardauth.Config{Identity: newIdentity(b), Decider: service(b, `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest(http.MethodGet, "http://sluice/v1/auth", nil)
		r.RemoteAddr = "127.0.0.1:4000"
		r.Header.Set("X-Original-URI", "/v1/messages?limit=10")
		r.Header.Set("X-Original-Method", "POST")
		r.Header.Set("X-Forwarded-For", "198.51.100.7")
		w := &nopWriter{h: http.Header{}}
		for pb.Next() {
			clear(w.h)
			h.ServeHTTP(w, r)
		}
	})
}
