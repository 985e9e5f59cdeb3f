// Command bench starts the servers that the figures of issue 5 are measured
// on, and drives a fixed-rate load for latency:
//
//	go run ./transport/proxy/testdata/bench serve
//	    upstream     127.0.0.1:18080  a trivial handler ("ok")
//	    proxy        127.0.0.1:18081  sluice's proxy in front of it
//	    forward-auth 127.0.0.1:18082  GET /v1/auth
//	    bare proxy   127.0.0.1:18084  the proxy with no limit to decide:
//	                                  net/http's part of the proxy's cost
//	go run ./transport/proxy/testdata/bench upstream   # the upstream alone
//	go run ./transport/proxy/testdata/bench sluice     # proxy and forward-auth alone
//	go run ./transport/proxy/testdata/bench load -url http://127.0.0.1:18081/ -rate 10000 -c 50 -d 10s
//
// serve, sluice and upstream take -port to move the first port (the others
// follow it), so that a second set can run beside the first.
//
// Every request is decided against the real decision service and memory
// store, with a per-client-IP limit high enough never to deny, so the
// figures include the whole decision. Throughput is measured with wrk.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/forwardauth"
	"github.com/sluicehq/sluice/transport/proxy"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: bench serve | bench load -url URL -rate N -c N -d DURATION")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	port := func() int {
		fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
		p := fs.Int("port", 18080, "port of the upstream; the proxy, forward-auth and pprof take the next three")
		_ = fs.Parse(os.Args[2:]) // ExitOnError: exits on a bad flag
		return *p
	}
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, port(), true)
	case "sluice":
		err = serve(ctx, port(), false)
	case "upstream":
		err = upstream(ctx, port())
	case "load":
		err = load(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// upstream serves only the trivial upstream, for measuring it in a
// process of its own.
func upstream(ctx context.Context, port int) error {
	return run(ctx, []*http.Server{{Addr: addr(port), Handler: okHandler()}})
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

// serve serves the proxy and the forward-auth endpoint, and the upstream
// too when withUpstream.
func serve(ctx context.Context, port int, withUpstream bool) error {
	set, err := rules.Parse("rules.yaml", []byte(`
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`))
	if err != nil {
		return err
	}
	st, err := memory.New(memory.DefaultConfig())
	if err != nil {
		return err
	}
	defer st.Close()
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = st
	svc, err := decide.New(dc)
	if err != nil {
		return err
	}
	id, err := identity.New(identity.Config{Domain: "bench", TrustedProxies: []string{"127.0.0.1"}, ForwardAuthHeaders: identity.ForwardAuthXOriginal,
		RateLimits: []identity.RateLimit{{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}}}}, nil)
	if err != nil {
		return err
	}
	up, err := url.Parse("http://" + addr(port))
	if err != nil {
		return err
	}
	pcfg := proxy.DefaultConfig()
	pcfg.Upstream, pcfg.Identity, pcfg.Decider = up, id, svc
	p, err := proxy.New(pcfg)
	if err != nil {
		return err
	}
	defer p.Close()
	bare, err := bareProxy(up)
	if err != nil {
		return err
	}
	defer bare.Close()
	fa, err := forwardauth.New(forwardauth.Config{Identity: id, Decider: svc})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/auth", fa)
	servers := []*http.Server{
		{Addr: addr(port + 1), Handler: p},
		{Addr: addr(port + 2), Handler: mux},
		{Addr: addr(port + 4), Handler: bare},
	}
	if withUpstream {
		servers = append(servers, &http.Server{Addr: addr(port), Handler: okHandler()})
	}
	if os.Getenv("BENCH_PPROF") != "" { // profiles on 127.0.0.1:18083/debug/pprof/ (port + 3)
		pm := http.NewServeMux()
		pm.HandleFunc("/debug/pprof/", pprof.Index)
		pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		servers = append(servers, &http.Server{Addr: addr(port + 3), Handler: pm})
	}
	return run(ctx, servers)
}

// bareProxy returns the proxy configured as serve's, but with no rate
// limits: it decides nothing and only forwards, through the same
// httputil.ReverseProxy and http.Transport.
func bareProxy(up *url.URL) (*proxy.Proxy, error) {
	id, err := identity.New(identity.Config{Domain: "bench"}, nil)
	if err != nil {
		return nil, err
	}
	cfg := proxy.DefaultConfig()
	cfg.Upstream, cfg.Identity, cfg.Decider = up, id, noDecider{}
	return proxy.New(cfg)
}

// noDecider is the Decider of the bare proxy, which has nothing to decide.
type noDecider struct{}

func (noDecider) Decide(context.Context, *decide.Request) (*decide.Response, error) {
	return nil, errors.New("bare proxy: nothing to decide")
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// run serves until ctx is done or a server fails, then shuts all down.
func run(ctx context.Context, servers []*http.Server) error {
	errs := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errs <- s.ListenAndServe() }() // stopped by Shutdown below
		slog.Info("serving", "addr", s.Addr)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	return err
}

// load sends GET requests to -url at -rate per second over -c connections
// for -d, each sent at its scheduled time (open loop), and prints the
// latency percentiles measured from the scheduled time, so that a stall
// delays the requests behind it rather than hiding them.
func load(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	target := fs.String("url", "", "URL to load")
	rate := fs.Int("rate", 1000, "requests per second")
	conns := fs.Int("c", 50, "connections")
	dur := fs.Duration("d", 10*time.Second, "duration")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The load shares the machine with what it measures, so it is kept
	// cheap: no gzip negotiation (wrk sends none either) and one request
	// per connection, reused.
	tr := &http.Transport{MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	n := int(float64(*rate) * dur.Seconds())
	interval := time.Second / time.Duration(*rate)
	start := time.Now().Add(100 * time.Millisecond)
	jobs := make(chan time.Time, *conns)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	var failed int
	base, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range *conns {
		wg.Add(1)
		// Each worker reuses its own request.
		req := base.Clone(ctx)
		go func() { // ends when jobs is closed
			defer wg.Done()
			for at := range jobs {
				if d := time.Until(at); d > 0 {
					time.Sleep(d)
				}
				resp, err := client.Do(req)
				ok := err == nil && resp.StatusCode == 200
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				el := time.Since(at)
				mu.Lock()
				if ok {
					lat = append(lat, el)
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		jobs <- start.Add(time.Duration(i) * interval)
	}
	close(jobs)
	wg.Wait()
	tr.CloseIdleConnections()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	took := time.Since(start)
	fmt.Printf("%s rate=%d/s c=%d: %d ok, %d failed, achieved %.0f/s, p50=%v p90=%v p99=%v p99.9=%v max=%v\n",
		*target, *rate, *conns, len(lat), failed, float64(len(lat))/took.Seconds(),
		pct(.50).Round(time.Microsecond), pct(.90).Round(time.Microsecond), pct(.99).Round(time.Microsecond),
		pct(.999).Round(time.Microsecond), pct(1).Round(time.Microsecond))
	return nil
}
