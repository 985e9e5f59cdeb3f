// Command shedload drives sluice's proxy at a multiple of its upstream's
// capacity with a mix of critical and sheddable traffic, with and without
// the load shedder, and reports the upstream's latency, the success of
// each class and what was shed. Everything runs on 127.0.0.1 in this
// process: the upstream (Workers workers and an unbounded queue, so its
// latency grows with its concurrency), the real proxy over the real
// decision service and memory store, and an open-loop load generator.
//
//	go run ./transport/proxy/testdata/shedload [-duration 10s] [-overload 3] [-critical 0.25]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/proxy"
	"github.com/sluicehq/sluice/transport/respond"
)

const rulesYAML = `
domain: api
descriptors:
  - key: class
    value: critical
    priority: critical
  - key: class
    value: batch
    priority: sheddable
`

// upstream serves each request with one of workers workers for service
// (±10%), queueing the rest first come, first served; it records each
// request's latency inside it (queue and service).
type upstream struct {
	workers chan struct{}
	service time.Duration
	mu      sync.Mutex
	lat     []time.Duration
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	select {
	case u.workers <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	d := u.service + time.Duration(rand.Int64N(int64(u.service)/5)) - u.service/10
	t := time.NewTimer(d)
	select {
	case <-t.C:
		_, _ = io.WriteString(w, "ok")
	case <-r.Context().Done():
		t.Stop()
	}
	<-u.workers
	u.mu.Lock()
	u.lat = append(u.lat, time.Since(start))
	u.mu.Unlock()
}

func (u *upstream) reset() []time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.lat
	u.lat = nil
	return l
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)*99)/100]
}

type result struct {
	sent, ok, shed, other [2]atomic.Int64 // [0] critical, [1] batch
}

func main() {
	workers := flag.Int("workers", 8, "upstream workers")
	service := flag.Duration("service", 50*time.Millisecond, "upstream service time per request")
	duration := flag.Duration("duration", 10*time.Second, "length of each loaded run")
	overload := flag.Float64("overload", 3, "offered load as a multiple of the upstream's capacity")
	critical := flag.Float64("critical", 0.25, "share of critical requests")
	flag.Parse()

	up := &upstream{workers: make(chan struct{}, *workers), service: *service}
	backend := httptest.NewServer(up)
	defer backend.Close()
	capacity := float64(*workers) / service.Seconds()
	fmt.Printf("upstream: %d workers, %v per request: capacity %.0f/s\n", *workers, *service, capacity)

	// Unloaded: a fifth of the capacity, no shedder.
	run(backend.URL, nil, capacity/5, 3*time.Second, *critical)
	base := p99(up.reset())
	fmt.Printf("unloaded (%.0f/s): upstream p99 %v\n\n", capacity/5, base.Round(time.Millisecond))

	for _, withShed := range []bool{true, false} {
		var gate *shed.Gate
		if withShed {
			g, err := shed.New(shed.Config{})
			if err != nil {
				fail(err)
			}
			gate = g
		}
		res := run(backend.URL, gate, capacity**overload, *duration, *critical)
		lat := up.reset()
		fmt.Printf("%.0fx overload (%.0f/s, %.0f%% critical), shedding %v:\n", *overload, capacity**overload, *critical*100, withShed)
		fmt.Printf("  upstream p99 %v (%.2fx unloaded), %d requests served\n", p99(lat).Round(time.Millisecond), float64(p99(lat))/float64(base), len(lat))
		for i, name := range []string{"critical", "sheddable"} {
			s := res.sent[i].Load()
			fmt.Printf("  %-9s sent %5d  ok %5d (%.2f%%)  shed 503 %5d  other %5d\n", name, s, res.ok[i].Load(), 100*float64(res.ok[i].Load())/float64(max(s, 1)), res.shed[i].Load(), res.other[i].Load())
		}
		if gate != nil {
			st := gate.Stats()
			fmt.Printf("  gate: limit %d at the end, minRTT %v, shed critical %d default %d sheddable %d\n", st.Limit, st.MinRTT.Round(time.Millisecond), st.Shed[shed.Critical], st.Shed[shed.Default], st.Shed[shed.Sheddable])
		}
		fmt.Println()
		time.Sleep(2 * time.Second) // let the upstream's queue drain between runs
		up.reset()
	}
}

// run sends rate requests a second for d through a fresh proxy, open loop
// (each at its time, whatever the others do), and waits for them all.
func run(target string, gate *shed.Gate, rate float64, d time.Duration, critical float64) *result {
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		fail(err)
	}
	st, err := memory.New(memory.DefaultConfig())
	if err != nil {
		fail(err)
	}
	defer st.Close()
	dc := decide.DefaultConfig()
	dc.Rules, dc.Store = func() *rules.Set { return set }, st
	svc, err := decide.New(dc)
	if err != nil {
		fail(err)
	}
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-Class", DescriptorKey: "class"}}}},
	}}, nil)
	if err != nil {
		fail(err)
	}
	u, _ := url.Parse(target)
	p, err := proxy.New(proxy.Config{Upstream: u, Identity: id, Decider: svc, Shed: gate,
		Respond: respond.New(respond.Config{RetryJitter: -1}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fail(err)
	}
	defer p.Close()
	front := httptest.NewServer(p)
	defer front.Close()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}

	res := &result{}
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		class, ci := "batch", 1
		if rand.Float64() < critical {
			class, ci = "critical", 0
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.sent[ci].Add(1)
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, front.URL+"/", nil)
			req.Header.Set("X-Class", class)
			resp, err := client.Do(req)
			switch {
			case err != nil:
				res.other[ci].Add(1)
				return
			case resp.StatusCode == http.StatusOK:
				res.ok[ci].Add(1)
			case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
				res.shed[ci].Add(1)
			default:
				res.other[ci].Add(1)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	client.CloseIdleConnections()
	return res
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
