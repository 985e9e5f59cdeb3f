package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/transport/proxy"
)

// TestShed: through the real proxy, with the upstream at the gate's limit,
// a sheddable request gets 503 with Retry-After and never reaches the
// upstream, a critical one waits and goes when the slot frees; the
// upstream's failures are counted.
func TestShed(t *testing.T) {
	up := newCountingUpstream()
	backend := httptest.NewServer(up)
	defer backend.Close()
	gate, err := shed.New(shed.Config{InitialLimit: 2, MinLimit: 2, MaxLimit: 2, MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-Class", DescriptorKey: "class"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := service(t, `
domain: api
descriptors:
  - {key: class, value: critical, priority: critical}
  - {key: class, value: batch, priority: sheddable}
`, nil)
	p := newProxy(t, backend.URL, proxy.Config{Decider: svc, Identity: id, Shed: gate})
	front := httptest.NewServer(p)
	defer front.Close()
	get := func(class string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, front.URL+"/", nil)
		req.Header.Set("X-Class", class)
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	done := make(chan *http.Response, 3)
	go func() { done <- get("critical") }()
	go func() { done <- get("") }() // no class: default
	testenv.WaitFor(t, "2 at the upstream", func() bool { return up.in.Load() == 2 })
	if r := get("batch"); r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("sheddable at the limit: %d Retry-After %q, want 503 with it", r.StatusCode, r.Header.Get("Retry-After"))
	}
	go func() { done <- get("critical") }()
	testenv.WaitFor(t, "a critical waiter", func() bool { return gate.Stats().Waiting == 1 })
	if up.seen.Load() != 2 {
		t.Fatalf("%d reached the upstream, want 2", up.seen.Load())
	}
	up.open()
	for range 3 {
		if r := <-done; r == nil || r.StatusCode != http.StatusOK {
			t.Fatalf("an admitted request: %v", r)
		}
	}
	up.fail.Store(true)
	if r := get("critical"); r.StatusCode != http.StatusBadGateway {
		t.Fatalf("failing upstream: %d", r.StatusCode)
	}
	testenv.WaitFor(t, "the slots back", func() bool { return gate.Stats().InFlight == 0 })
	st := gate.Stats()
	if st.Failed != 1 || st.Shed[shed.Sheddable] != 1 || st.Admitted[shed.Critical] != 3 || st.Admitted[shed.Default] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShedExample: the shipped examples/protect.yaml through the real
// proxy, with the upstream at the gate's limit: an export is sheddable and
// is shed at once, though the per-address rule it also matches states no
// priority (before, that rule counted as default and outranked it: exports
// were never shed first); a checkout is critical and waits for a slot.
func TestShedExample(t *testing.T) {
	up := newCountingUpstream()
	backend := httptest.NewServer(up)
	defer backend.Close()
	gate, err := shed.New(shed.Config{InitialLimit: 2, MinLimit: 2, MaxLimit: 2, MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	idc, err := identity.Load("../../examples/protect-identity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		t.Fatal(err)
	}
	rulesYAML, err := os.ReadFile("../../examples/protect.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, backend.URL, proxy.Config{Decider: service(t, string(rulesYAML), nil), Identity: id, Shed: gate})
	front := httptest.NewServer(p)
	defer front.Close()
	get := func(path string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, front.URL+path, nil)
		req.Header.Set("X-User", "bob")
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	done := make(chan *http.Response, 3)
	for range 2 {
		go func() { done <- get("/items") }() // default: no rule states a priority
	}
	testenv.WaitFor(t, "2 at the upstream", func() bool { return up.in.Load() == 2 })
	if r := get("/export/all.csv"); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("an export at the limit: %d, want 503", r.StatusCode)
	}
	go func() { done <- get("/checkout") }()
	testenv.WaitFor(t, "a checkout waiting", func() bool { return gate.Stats().Waiting == 1 })
	up.open()
	for range 3 {
		if r := <-done; r == nil || r.StatusCode != http.StatusOK {
			t.Fatalf("an admitted request: %v", r)
		}
	}
	st := gate.Stats()
	if st.Shed[shed.Sheddable] != 1 || st.Admitted[shed.Default] != 2 || st.Admitted[shed.Critical] != 1 {
		t.Fatalf("stats %+v: want the export shed as sheddable, the checkout admitted as critical", st)
	}
}
