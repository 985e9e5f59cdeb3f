package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/transport/proxy"
)

// BenchmarkProxy sends keep-alive GETs from parallel clients to a trivial
// loopback upstream: directly, through a bare proxy (no limits, so nothing
// decided: httputil.ReverseProxy and http.Transport alone), and through the
// proxy (real decision service and memory store, a per-client-IP limit
// that never denies, as in testdata/bench). Clients, proxy and upstream
// share the process, so the proxy's cost per request is proxied minus
// direct, in allocs/op and in cpu-µs/op (the process's user+system CPU
// time per request), and sluice's own part of it is proxy minus bare.
func BenchmarkProxy(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	b.Cleanup(upstream.Close)
	id, err := identity.New(identity.Config{Domain: "bench", TrustedProxies: []string{"127.0.0.1"},
		RateLimits: []identity.RateLimit{{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}}}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	dec := testenv.Decider(b, `
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`, nil)
	p := newProxy(b, upstream.URL, proxy.Config{Identity: id, Decider: dec})
	front := httptest.NewServer(p)
	b.Cleanup(front.Close)
	noLimits, err := identity.New(identity.Config{Domain: "bench"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	bare := httptest.NewServer(newProxy(b, upstream.URL, proxy.Config{Identity: noLimits, Decider: dec}))
	b.Cleanup(bare.Close)
	for _, bc := range []struct{ name, url string }{{"direct", upstream.URL}, {"bare", bare.URL}, {"proxy", front.URL}} {
		b.Run(bc.name, func(b *testing.B) {
			tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			b.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr}
			b.SetParallelism(8) // 16 clients on 2 cores
			b.ReportAllocs()
			start := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(bc.url + "/")
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
