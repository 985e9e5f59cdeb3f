package proxy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/transport/proxy"
)

// echo is an upstream that records the order of the requests it sees and
// signals each on arrived, if set.
type echo struct {
	mu      sync.Mutex
	seen    []string
	arrived chan<- struct{}
}

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.seen = append(e.seen, r.Header.Get("X-Seq"))
	e.mu.Unlock()
	if e.arrived != nil {
		e.arrived <- struct{}{}
	}
	fmt.Fprintf(w, "ok %s", r.Header.Get("X-Seq"))
}

func (e *echo) Seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.seen)
}

func get(t *testing.T, url, seq string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Error(err)
		return nil, ""
	}
	req.Header.Set("X-Seq", seq)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return nil, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp, string(b)
}

func TestLimitThen429(t *testing.T) {
	t.Parallel()
	up := &echo{}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	clk := clocktest.New(t0)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, `
domain: api
descriptors:
  - {key: all, rate_limit: {name: all, unit: second, requests_per_unit: 2}}
`, clk)})
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	for i, want := range []int{200, 200, 429} {
		resp, body := get(t, front.URL+"/x", strconv.Itoa(i))
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %q, want %d", i, resp.StatusCode, body, want)
		}
		if want == 429 && (resp.Header.Get("Retry-After") != "1" || body != `{"error":"rate limited","retry_after":1}`+"\n") {
			t.Fatalf("429: Retry-After %q body %q", resp.Header.Get("Retry-After"), body)
		}
		if want == 200 && (body != "ok "+strconv.Itoa(i) || resp.Header.Get("RateLimit") != fmt.Sprintf(`"all";r=%d;t=1`, 1-i)) {
			t.Fatalf("request %d: body %q RateLimit %q", i, body, resp.Header.Get("RateLimit"))
		}
	}
	if got := up.Seen(); !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("upstream saw %v", got)
	}
}

// TestQueueRefusesOverLimitAtOnce: in queue mode, a request over a limit
// is answered 429 at once, however soon its retry comes: nothing holds a
// place for it, so a wait could end in a refusal.
func TestQueueRefusesOverLimitAtOnce(t *testing.T) {
	t.Parallel()
	const rulesYAML = `
domain: api
descriptors:
  - {key: all, rate_limit: {unit: second, requests_per_unit: 2}}
`
	for _, maxDelay := range []time.Duration{0, 299 * time.Millisecond, 500 * time.Millisecond} {
		t.Run(maxDelay.String(), func(t *testing.T) {
			t.Parallel()
			upstream := httptest.NewServer(&echo{})
			t.Cleanup(upstream.Close)
			clk := clocktest.New(t0.Add(700 * time.Millisecond))
			p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, rulesYAML, clk), MaxDelay: maxDelay, Sleep: clk.Sleep})
			for i, want := range []int{200, 200, 429} {
				rec := httptest.NewRecorder()
				p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				if rec.Code != want {
					t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
				}
			}
			if got := clk.Slept(); len(got) != 0 {
				t.Fatalf("slept %v, want no wait", got)
			}
		})
	}
}

const leaky = `
domain: api
descriptors:
  - key: all
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 5}
`

// TestQueueLeakyBucket: the leaky bucket admits 5, each waiting 100 ms
// after the one before; the proxy holds each for its turn, up to MaxDelay,
// and refuses at once the one whose turn is further and the one the bucket
// denies.
func TestQueueLeakyBucket(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(&echo{})
	t.Cleanup(upstream.Close)
	clk := clocktest.New(t0)
	frozen := clocktest.New(t0) // the store's time stands still: every decision at t0
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, leaky, frozen), MaxDelay: 350 * time.Millisecond, Sleep: clk.Sleep})
	var codes []int
	var retries []string
	for range 6 {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		codes = append(codes, rec.Code)
		if rec.Code == 429 {
			retries = append(retries, rec.Header().Get("Retry-After"))
		}
	}
	// Waits 0, 100, 200, 300 ms pass; 400 ms is beyond MaxDelay and is
	// told to come back after its turn; the sixth is over the bucket.
	if want := []int{200, 200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("statuses %v, want %v", codes, want)
	}
	if !slices.Equal(retries, []string{"1", "1"}) {
		t.Fatalf("Retry-After %q, want 1 and 1", retries)
	}
	ms := time.Millisecond
	if got, want := clk.Slept(), []time.Duration{100 * ms, 200 * ms, 300 * ms}; !slices.Equal(got, want) {
		t.Fatalf("slept %v, want %v", got, want)
	}
}

// TestQueueServesWhomItHolds is the scene with the shipped
// examples/queue/rules.yaml (a leaky bucket of 5 a second holding 15, per
// client IP) and --max-delay 3s: of 30 requests at one instant, the 15 the
// bucket admits are each held for their turn and served, and the other 15
// are refused at once; no request that waited is refused.
func TestQueueServesWhomItHolds(t *testing.T) {
	t.Parallel()
	yaml, err := os.ReadFile("../../examples/queue/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	up := &echo{}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	clk := clocktest.New(t0)
	frozen := clocktest.New(t0)     // all 30 arrive at once
	idc := identity.DefaultConfig() // per client IP, as sluice proxy without --identity
	idc.Domain = "api"
	id, err := identity.New(idc, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, upstream.URL, proxy.Config{Identity: id, Decider: service(t, string(yaml), frozen), MaxDelay: 3 * time.Second, Sleep: clk.Sleep})
	served, refused := 0, 0
	for i := range 30 {
		before := len(clk.Slept())
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		waited := len(clk.Slept()) > before
		switch {
		case rec.Code == 200:
			served++
		case rec.Code == 429 && !waited:
			refused++
		default:
			t.Fatalf("request %d: %d after waiting %v", i, rec.Code, waited)
		}
	}
	if served != 15 || refused != 15 || len(up.Seen()) != 15 {
		t.Fatalf("served %d, refused %d, upstream saw %d; want 15, 15, 15", served, refused, len(up.Seen()))
	}
	// The first admitted goes at once, the others 200 ms apart: 200 ms ..
	// 2.8 s.
	if got := clk.Slept(); len(got) != 14 || got[0] != 200*time.Millisecond || got[13] != 2800*time.Millisecond {
		t.Fatalf("slept %v, want 14 waits from 200 ms to 2.8 s", got)
	}
}

// TestQueueKeepsOrder sends requests one after another into a real leaky
// bucket with real timers: they reach the upstream in the order they came.
// Their turns are 100 ms apart, so that a busy machine does not swap them.
func TestQueueKeepsOrder(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 10)
	up := &echo{arrived: arrived}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	// The store's time stands still, so each queued request's turn is
	// exactly one emission interval after the previous one's; the fake
	// Sleep holds every waiter until the test wakes it, so no scheduling
	// delay of a loaded machine can reorder them.
	type sleeper struct {
		d    time.Duration
		wake chan struct{}
	}
	slept := make(chan sleeper, 10)
	sleep := func(ctx context.Context, d time.Duration) error {
		s := sleeper{d, make(chan struct{})}
		slept <- s
		select {
		case <-s.wake:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, `
domain: api
descriptors:
  - key: all
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 6}
`, clocktest.New(t0)), MaxDelay: time.Second, Sleep: sleep})
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	var wg sync.WaitGroup
	var want []string
	var waiting []sleeper
	for i := range 6 {
		want = append(want, strconv.Itoa(i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, body := get(t, front.URL, strconv.Itoa(i)); resp != nil && resp.StatusCode != 200 {
				t.Errorf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}()
		// Send the next one only once this one holds its place in the
		// queue, or, the first, has passed.
		if i == 0 {
			<-arrived
		} else {
			waiting = append(waiting, <-slept)
		}
	}
	for i, s := range waiting {
		if want := time.Duration(i+1) * 100 * time.Millisecond; s.d != want {
			t.Errorf("request %d waits %v, want %v (its place in the queue)", i+1, s.d, want)
		}
	}
	// Wake them in the order of their turns, each once the one before has
	// reached the upstream.
	slices.SortStableFunc(waiting, func(a, b sleeper) int { return int(a.d - b.d) })
	for _, s := range waiting {
		close(s.wake)
		<-arrived
	}
	wg.Wait()
	if got := up.Seen(); !slices.Equal(got, want) {
		t.Fatalf("upstream order %v, want %v", got, want)
	}
}

// TestQueueBound holds MaxWaiting requests in the queue; the next is
// rejected at once, and the held ones pass when released.
func TestQueueBound(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(&echo{})
	t.Cleanup(upstream.Close)
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	clk := clocktest.New(t0)
	clk.BeforeSleep = func(ctx context.Context) error {
		entered <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	frozen := clocktest.New(t0)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, leaky, frozen), MaxDelay: time.Second, MaxWaiting: 2, Sleep: clk.Sleep})
	serve := func() int {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code
	}
	if c := serve(); c != 200 { // no wait
		t.Fatalf("first: %d", c)
	}
	results := make(chan int, 2)
	for range 2 {
		go func() { results <- serve() }()
		<-entered
	}
	if p.Waiting() != 2 {
		t.Fatalf("waiting %d, want 2", p.Waiting())
	}
	if c := serve(); c != 429 {
		t.Fatalf("past the bound: %d, want 429", c)
	}
	close(release)
	for range 2 {
		if c := <-results; c != 200 {
			t.Fatalf("held request: %d, want 200", c)
		}
	}
	if p.Waiting() != 0 {
		t.Fatalf("waiting %d after release", p.Waiting())
	}
}

// TestQueueClientGivesUp: a client that leaves while held is not
// forwarded, with a real timer.
func TestQueueClientGivesUp(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 10)
	entered := make(chan struct{}, 10)
	up := &echo{arrived: arrived}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	frozen := clocktest.New(t0)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, `
domain: api
descriptors:
  - key: all
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: leaky_bucket, burst: 2}
`, frozen), MaxDelay: time.Hour, Sleep: signalSleep(entered)})
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	<-arrived
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
	}()
	<-entered
	if p.Waiting() != 1 {
		t.Fatalf("waiting %d, want 1", p.Waiting())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled request is still held")
	}
	if n := len(up.Seen()); n != 1 || p.Waiting() != 0 {
		t.Fatalf("upstream saw %d, waiting %d; want 1 and 0", n, p.Waiting())
	}
}

func TestUpstreamFailures(t *testing.T) {
	t.Parallel()
	closedURL, slowURL := failingUpstreams(t)
	// A listener that accepts and never answers.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mute.Close() })
	tests := []struct {
		name     string
		upstream string
		want     int
	}{
		{"connection refused", closedURL, 502},
		{"no response headers in time", slowURL, 504},
		{"a listener that never answers", "http://" + mute.Addr().String(), 504},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newProxy(t, tt.upstream, proxy.Config{Decider: service(t, "domain: api\n", nil), ResponseHeaderTimeout: 100 * time.Millisecond, DialTimeout: time.Second})
			rec := httptest.NewRecorder()
			start := time.Now()
			p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d", rec.Code, tt.want)
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Fatalf("took %v", el)
			}
		})
	}
}

// TestStreaming: the response reaches the client chunk by chunk while the
// upstream is still writing, and a request body arrives unchanged.
func TestStreaming(t *testing.T) {
	t.Parallel()
	next := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			h := sha256.New()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(upstream.Close)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, "domain: api\n", nil)})
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	resp, err := http.Get(front.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("chunk %d: %q %v", i, line, err)
		}
		next <- struct{}{} // the upstream writes the next chunk only now
	}

	body := make([]byte, 3<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { // owned here: ends when the body is written or the pipe closed
		for off := 0; off < len(body); off += 64 << 10 {
			if _, err := pw.Write(body[off:min(off+64<<10, len(body))]); err != nil {
				return
			}
		}
		pw.Close()
	}()
	post, err := http.Post(front.URL+"/upload", "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	defer post.Body.Close()
	got, err := io.ReadAll(post.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d %x", len(body), sha256.Sum256(body)); string(got) != want {
		t.Fatalf("upstream got %q, want %q", got, want)
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  proxy.Config
	}{
		{"upstream without a host", proxy.Config{Upstream: &url.URL{Path: "/x"}, Identity: everyone(t), Decider: service(t, "domain: api\n", nil)}},
		{"no upstream", proxy.Config{Identity: everyone(t), Decider: service(t, "domain: api\n", nil)}},
		{"no identity", proxy.Config{Upstream: &url.URL{Scheme: "http", Host: "x"}, Decider: service(t, "domain: api\n", nil)}},
		{"negative MaxDelay", proxy.Config{Upstream: &url.URL{Scheme: "http", Host: "x"}, Identity: everyone(t), Decider: service(t, "domain: api\n", nil), MaxDelay: -1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := proxy.New(tt.cfg); err == nil {
				t.Fatal("New succeeded")
			}
		})
	}
}

// TestDenialWithoutRetry: a denial that names no retry time (the decision
// service failing closed) is answered at once in queue mode, not retried
// in a loop.
func TestDenialWithoutRetry(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(&echo{})
	t.Cleanup(upstream.Close)
	var calls atomic.Int64
	closed := decider(func(context.Context, *decide.Request) (*decide.Response, error) {
		calls.Add(1)
		return &decide.Response{Overall: decide.OverLimit, Statuses: []decide.Status{{Code: decide.OverLimit}}}, nil
	})
	p := newProxy(t, upstream.URL, proxy.Config{Decider: closed, MaxDelay: time.Second})
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "1" || calls.Load() != 1 {
		t.Fatalf("%d, Retry-After %q, %d decisions; want 429, 1, 1", rec.Code, rec.Header().Get("Retry-After"), calls.Load())
	}
}

// TestSlowBody trickles request bodies through a real proxy whose
// BodyIdleTimeout is short: a body the proxy streams upstream and one it
// never reads (a 429) are cut off within the bound and their connections
// closed; a body that arrived whole does not limit how long the upstream
// may take to answer.
func TestSlowBody(t *testing.T) {
	t.Parallel()
	const idle = 200 * time.Millisecond
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		if r.URL.Path == "/slow-answer" {
			// Answer after several idle bounds, unless the proxy gives up
			// on the request first.
			select {
			case <-time.After(5 * idle):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "got %d", n)
	}))
	t.Cleanup(upstream.Close)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, `
domain: api
descriptors:
  - {key: all, rate_limit: {unit: hour, requests_per_unit: 2}}
`, clocktest.New(t0)), BodyIdleTimeout: idle})
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	post, err := http.Post(front.URL+"/slow-answer", "text/plain", strings.NewReader("whole"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(post.Body)
	post.Body.Close()
	if err != nil || post.StatusCode != 200 || string(body) != "got 5" {
		t.Fatalf("a whole body with a slow answer: %d %q %v", post.StatusCode, body, err)
	}

	// The limit's second request streams upstream; the third is denied.
	for _, name := range []string{"streamed upstream", "denied, never read"} {
		conn, err := net.Dial("tcp", front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"); err != nil {
			t.Fatal(err)
		}
		// The rest never comes: wait for the proxy to close the
		// connection; the guard is far past the bound.
		start := time.Now()
		if err := conn.SetReadDeadline(start.Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: connection still open after %v; read %q", name, time.Since(start), got)
		}
	}
}
