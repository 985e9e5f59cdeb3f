package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/slots"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/proxy"
)

const concurrencyRules = `
domain: api
descriptors:
  - key: all
    concurrency: 20
`

// countingUpstream counts the requests inside it, remembers the most at
// once, and holds each until release is closed, its client leaves, or it
// is told to fail (then it drops the connection without an answer).
type countingUpstream struct {
	in, most, seen atomic.Int64
	mu             sync.Mutex
	release        chan struct{}
	fail           atomic.Bool
}

func newCountingUpstream() *countingUpstream {
	return &countingUpstream{release: make(chan struct{})}
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.in.Add(1)
	defer u.in.Add(-1)
	u.seen.Add(1)
	for {
		m := u.most.Load()
		if n <= m || u.most.CompareAndSwap(m, n) {
			break
		}
	}
	if u.fail.Load() {
		panic(http.ErrAbortHandler) // the connection is cut: the proxy answers 502
	}
	u.mu.Lock()
	release := u.release
	u.mu.Unlock()
	select {
	case <-release:
		_, _ = io.WriteString(w, "ok")
	case <-r.Context().Done():
	}
}

// reopen makes later requests wait again after a release.
func (u *countingUpstream) reopen() {
	u.mu.Lock()
	u.release = make(chan struct{})
	u.mu.Unlock()
}

func (u *countingUpstream) open() {
	u.mu.Lock()
	close(u.release)
	u.mu.Unlock()
}

// TestConcurrencyLimit sends 200 slow requests at once through the real
// proxy against `concurrency: 20`: never more than 20 reach the upstream
// at once and the rest get 429; then the slots come back when the
// requests end well, when their clients disconnect, and when the upstream
// fails.
func TestConcurrencyLimit(t *testing.T) {
	up := newCountingUpstream()
	backend := httptest.NewServer(up)
	defer backend.Close()
	held := &countedSlots{}
	p := newProxy(t, backend.URL, proxy.Config{Decider: slotService(t, concurrencyRules, held)})
	front := httptest.NewServer(p)
	defer front.Close()
	client := front.Client()
	client.Transport.(*http.Transport).MaxConnsPerHost = 0
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 256

	// round sends n requests at once with ctx and returns the count of
	// each status, once all have answered (or given up).
	var answered atomic.Int64
	round := func(ctx context.Context, n int) map[int]int {
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/slow", nil)
				resp, err := client.Do(req)
				code := -1 // the client gave up
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				answered.Add(1)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		return codes
	}

	// 1. 200 at once: 20 reach the upstream, 180 are refused.
	done := make(chan map[int]int)
	go func() { done <- round(context.Background(), 200) }()
	testenv.WaitFor(t, "20 requests at the upstream", func() bool { return up.in.Load() == 20 })
	testenv.WaitFor(t, "180 refusals", func() bool { return answered.Load() == 180 })
	if n := up.seen.Load(); n != 20 {
		t.Fatalf("%d requests reached the upstream, want 20", n)
	}
	up.open()
	codes := <-done
	testenv.WaitFor(t, "the slots back", func() bool { return held.n.Load() == 0 })
	if codes[http.StatusOK] != 20 || codes[http.StatusTooManyRequests] != 180 {
		t.Fatalf("200 at once: %v, want 20 OK and 180 429", codes)
	}
	if m := up.most.Load(); m > 20 {
		t.Fatalf("%d requests at the upstream at once, want at most 20", m)
	}

	// 2. Clients that leave give their slots back.
	up.reopen()
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan map[int]int)
	go func() { gone <- round(ctx, 20) }()
	testenv.WaitFor(t, "20 leaving requests at the upstream", func() bool { return up.in.Load() == 20 })
	cancel()
	<-gone
	testenv.WaitFor(t, "the leavers to leave the upstream", func() bool { return up.in.Load() == 0 })
	testenv.WaitFor(t, "the slots of the clients gone", func() bool { return held.n.Load() == 0 })
	if !fits(t, up, round, 20) {
		t.Fatal("the slots of the clients gone did not come back")
	}
	testenv.WaitFor(t, "the slots back", func() bool { return held.n.Load() == 0 })

	// 3. An upstream that fails gives the slots back too.
	up.fail.Store(true)
	if c := round(context.Background(), 20); c[http.StatusBadGateway] != 20 {
		t.Fatalf("failing upstream: %v, want 20 502", c)
	}
	up.fail.Store(false)
	testenv.WaitFor(t, "the slots of the failed requests", func() bool { return held.n.Load() == 0 })
	if !fits(t, up, round, 20) {
		t.Fatal("the slots of requests the upstream failed did not come back")
	}
	if m := up.most.Load(); m > 20 {
		t.Fatalf("%d requests at the upstream at once, want at most 20", m)
	}
}

// fits sends a round of n requests to an upstream that answers at once and
// reports whether every one was admitted.
func fits(t *testing.T, up *countingUpstream, round func(context.Context, int) map[int]int, n int) bool {
	t.Helper()
	up.reopen()
	up.open()
	return round(context.Background(), n)[http.StatusOK] == n
}

// countedSlots is the real slots.Memory that counts the slots held.
type countedSlots struct {
	m *slots.Memory
	n atomic.Int64
}

func (c *countedSlots) Acquire(ctx context.Context, key string, limit int64, lease time.Duration) (slots.Grant, error) {
	g, err := c.m.Acquire(ctx, key, limit, lease)
	if g.OK {
		c.n.Add(1)
	}
	return g, err
}

func (c *countedSlots) Release(ctx context.Context, key string, token uint64) error {
	c.n.Add(-1)
	return c.m.Release(ctx, key, token)
}

// slotService returns the real decision service over the memory store,
// with its slots counted by held.
func slotService(t testing.TB, rulesYAML string, held *countedSlots) *decide.Service {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if held.m, err = slots.NewMemory(slots.Config{}); err != nil {
		t.Fatal(err)
	}
	ac := admit.DefaultConfig()
	ac.Slots = held
	step, err := admit.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	dc := decide.DefaultConfig()
	dc.Rules, dc.Store, dc.Admit = func() *rules.Set { return set }, st, step
	s, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConcurrencyRetryAfter checks the 429 of a concurrency denial: its
// Retry-After is 1 (a slot frees when any response ends), as serve's JSON
// API says, not the 10 minutes a held slot's lease may last (issue 24.4).
func TestConcurrencyRetryAfter(t *testing.T) {
	up := newCountingUpstream()
	backend := httptest.NewServer(up)
	defer backend.Close()
	held := &countedSlots{}
	p := newProxy(t, backend.URL, proxy.Config{Decider: slotService(t, `
domain: api
descriptors:
  - key: all
    concurrency: 1
`, held)})
	front := httptest.NewServer(p)
	defer front.Close()
	defer up.open() // before the servers close, which wait for it

	go func() {
		if resp, err := front.Client().Get(front.URL + "/slow"); err == nil {
			resp.Body.Close()
		}
	}()
	testenv.WaitFor(t, "one request at the upstream", func() bool { return up.in.Load() == 1 })
	resp, err := front.Client().Get(front.URL + "/second")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", resp.StatusCode)
	}
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
}
