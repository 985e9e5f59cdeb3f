package forwardauth_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/transport/forwardauth"
)

// recipeRules limits each client to 3 requests a minute and each user to
// one login a minute.
const recipeRules = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 3}
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {name: login, unit: minute, requests_per_unit: 1}
`

// TestCaddy runs the shipped examples/caddy/Caddyfile in a real Caddy with
// the identity file beside it: a 200 carries sluice's fields to the client,
// a 429 is sluice's own, a client's X-Original-URI or X-Forwarded-Uri does
// not move its request off a limit, and with sluice down requests pass.
func TestCaddy(t *testing.T) {
	t.Parallel()
	testenv.CaddyBinary(t) // skip early when there is none
	var upstreamHits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		fmt.Fprintf(w, "hello %s %s", r.Method, r.URL.Path)
	}))
	t.Cleanup(upstream.Close)
	idc, err := identity.Load("../../examples/caddy/identity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := forwardauth.New(forwardauth.Config{Identity: id, Decider: service(t, recipeRules)})
	if err != nil {
		t.Fatal(err)
	}
	sluice := httptest.NewServer(h)
	t.Cleanup(sluice.Close)

	base := caddyRecipe(t, strings.TrimPrefix(sluice.URL, "http://"), upstream.URL)

	do := func(c *http.Client, method, path string, headers ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}

	// 200: the application's answer with sluice's fields; a spoofed
	// X-Forwarded-For does not make a new client.
	alice := clientFrom("127.0.0.2")
	for i, spoof := range []string{"", "10.0.0.1", "10.0.0.2"} {
		resp, body := do(alice, "GET", "/page", "X-Forwarded-For", spoof)
		if resp.StatusCode != 200 || body != "hello GET /page" {
			t.Fatalf("request %d: %d %q, want 200 from the upstream", i+1, resp.StatusCode, body)
		}
		if want := fmt.Sprintf(`"per-ip";r=%d;t=50`, 2-i); resp.Header.Get("RateLimit") != want {
			t.Fatalf("request %d: RateLimit %q, want %q (headers %v)", i+1, resp.Header.Get("RateLimit"), want, resp.Header)
		}
		if resp.Header.Get("RateLimit-Policy") != `"per-ip";q=3;w=60` || resp.Header.Get("X-RateLimit-Limit") != "3" ||
			resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) || resp.Header.Get("X-RateLimit-Reset") != "50" {
			t.Fatalf("request %d: headers %v", i+1, resp.Header)
		}
	}
	// 429: sluice's answer as it wrote it.
	resp, body := do(alice, "GET", "/page", "X-Forwarded-For", "10.0.0.3")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") != `"per-ip";r=0;t=50` {
		t.Fatalf("over the limit: %d %v, want 429 with Retry-After and RateLimit", resp.StatusCode, resp.Header)
	}
	if !strings.Contains(body, `"rate limited"`) {
		t.Fatalf("429 body %q", body)
	}
	if n := upstreamHits.Load(); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}

	// The client's own forward-auth headers do not move POST /login.
	bob := clientFrom("127.0.0.3")
	for i, want := range []int{200, 429} {
		resp, body := do(bob, "POST", "/login", "X-User", "bob", "X-Original-URI", "/other", "X-Original-Method", "GET",
			"X-Forwarded-Uri", "/other", "X-Forwarded-Method", "GET")
		if resp.StatusCode != want {
			t.Fatalf("login %d: %d %q (RateLimit %q), want %d", i+1, resp.StatusCode, body, resp.Header.Get("RateLimit"), want)
		}
		if want == 200 && body != "hello POST /login" {
			t.Fatalf("login %d: body %q", i+1, body)
		}
	}

	// A header beyond sluice's caps: sluice's 400 reaches the client.
	if resp, body := do(clientFrom("127.0.0.6"), "GET", "/page", "X-User", strings.Repeat("u", 5000)); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(body, "more than the cap") {
		t.Fatalf("a 5,000-byte X-User: %d %q, want sluice's 400", resp.StatusCode, body)
	}

	// sluice unreachable: Caddy fails open.
	sluice.Close()
	carol := clientFrom("127.0.0.4")
	if resp, body := do(carol, "GET", "/other"); resp.StatusCode != 200 || body != "hello GET /other" || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("sluice down: %d %q %v, want 200 from the upstream without rate limit fields", resp.StatusCode, body, resp.Header)
	}
}

// caddyRecipe runs the shipped examples/caddy/Caddyfile in a real Caddy,
// asking sluice at sluiceAddr and passing requests to upstream, and
// returns its base URL.
func caddyRecipe(t *testing.T, sluiceAddr, upstream string) string {
	t.Helper()
	conf, err := os.ReadFile("../../examples/caddy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	cfg := testenv.Replace(t, string(conf),
		"127.0.0.1:8080", sluiceAddr,
		"127.0.0.1:9000", strings.TrimPrefix(upstream, "http://"),
		":8000 {", ":"+strconv.Itoa(port)+" {\n\tbind 127.0.0.1",
	)
	testenv.Caddy(t, cfg, port)
	return "http://127.0.0.1:" + strconv.Itoa(port)
}

// TestCaddySilentSluice: a sluice that accepts connections but never
// answers holds a request no longer than the recipe's 2 s, then Caddy
// passes it on.
func TestCaddySilentSluice(t *testing.T) {
	t.Parallel()
	testenv.CaddyBinary(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	t.Cleanup(upstream.Close)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	go func() { // owned by the cleanup, which closes silent and the connections
		for {
			c, err := silent.Accept()
			if err != nil {
				close(held)
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		for c := range held {
			c.Close()
		}
	})
	base := caddyRecipe(t, silent.Addr().String(), upstream.URL)
	start := time.Now()
	resp, err := clientFrom("127.0.0.5").Get(base + "/page")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || string(body) != "hello /page" {
		t.Fatalf("sluice silent: %d %q, want 200 from the upstream", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the request took %v, want about 2s", d)
	}
}
