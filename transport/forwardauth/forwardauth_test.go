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
	"github.com/sluicehq/sluice/transport/respond"
)

const perIP = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {name: login, unit: minute, requests_per_unit: 1}
`

func newIdentity(t testing.TB) *identity.Identity {
	t.Helper()
	return newIdentityFor(t, identity.ForwardAuthXOriginal)
}

// newIdentityFor limits per client and on /login, reading the original
// request from the header family fa.
func newIdentityFor(t testing.TB, fa string) *identity.Identity {
	t.Helper()
	id, err := identity.New(identity.Config{
		Domain:             "api",
		TrustedProxies:     []string{"127.0.0.1/32"},
		ForwardAuthHeaders: fa,
		RateLimits: []identity.RateLimit{
			{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}},
			{Actions: []identity.Action{{Path: &identity.PathAction{Exact: "/login"}}}},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestOnlyTheNamedHeaders: behind Traefik or Caddy the client's own
// headers reach /v1/auth beside the proxy's X-Forwarded-Method and -Uri;
// a client that adds X-Original-URI must not move its request off a limit
// on /login, nor a client behind nginx with X-Forwarded-Uri.
func TestOnlyTheNamedHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		family  string
		headers []string // the proxy's, then the client's own
	}{
		{"Traefik or Caddy, the client adds X-Original-*", identity.ForwardAuthXForwarded,
			[]string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Original-Method", "GET", "X-Original-URI", "/other"}},
		{"nginx, the client adds X-Forwarded-*", identity.ForwardAuthXOriginal,
			[]string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/other"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, err := forwardauth.New(forwardauth.Config{Identity: newIdentityFor(t, tt.family), Decider: service(t, perIP)})
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []int{200, 429} { // login: 1 a minute
				r := httptest.NewRequest(http.MethodGet, "http://sluice/v1/auth", nil)
				r.RemoteAddr = "127.0.0.1:3000"
				r.Header.Set("X-Forwarded-For", "198.51.100.1")
				for j := 0; j+1 < len(tt.headers); j += 2 {
					r.Header.Set(tt.headers[j], tt.headers[j+1])
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if rec.Code != want {
					t.Fatalf("login %d: %d (RateLimit %q), want %d", i+1, rec.Code, rec.Header().Get("RateLimit"), want)
				}
			}
		})
	}
}

// TestTraefik calls the handler as Traefik's ForwardAuth does: the original
// method and URI in X-Forwarded-*, the client in X-Forwarded-For.
func TestTraefik(t *testing.T) {
	t.Parallel()
	h, err := forwardauth.New(forwardauth.Config{
		Identity: newIdentityFor(t, identity.ForwardAuthXForwarded),
		Decider:  service(t, perIP),
		Respond:  respond.New(respond.Config{Rand: func(int64) int64 { return 0 }, RetryJitter: time.Second}),
	})
	if err != nil {
		t.Fatal(err)
	}
	call := func(peer, xff, uri string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "http://sluice/v1/auth", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("X-Forwarded-Method", "POST")
		r.Header.Set("X-Forwarded-Uri", uri)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	tests := []struct {
		name   string
		peer   string
		xff    string
		uri    string
		status int
		state  string
	}{
		{"first of a client behind the proxy", "127.0.0.1:3000", "198.51.100.1", "/", 200, `"per-ip";r=2;t=50`},
		{"second", "127.0.0.1:3000", "198.51.100.1", "/", 200, `"per-ip";r=1;t=50`},
		{"login: both limits", "127.0.0.1:3000", "198.51.100.1", "/login", 200, `"per-ip";r=0;t=50, "login";r=0;t=50`},
		{"fourth is denied", "127.0.0.1:3000", "198.51.100.1", "/", 429, `"per-ip";r=0;t=50`},
		{"another client behind the proxy passes", "127.0.0.1:3000", "198.51.100.2", "/", 200, `"per-ip";r=2;t=50`},
		{"an untrusted caller cannot pose as a fresh client", "203.0.113.9:1", "198.51.100.3", "/", 200, `"per-ip";r=2;t=50`},
		{"and is counted as itself", "203.0.113.9:1", "198.51.100.4", "/", 200, `"per-ip";r=1;t=50`},
	}
	for _, tt := range tests { // in order: each step sees the previous ones
		rec := call(tt.peer, tt.xff, tt.uri)
		if rec.Code != tt.status || rec.Header().Get("RateLimit") != tt.state {
			t.Fatalf("%s: %d %q, want %d %q", tt.name, rec.Code, rec.Header().Get("RateLimit"), tt.status, tt.state)
		}
		if tt.status == 429 {
			if ra := rec.Header().Get("Retry-After"); ra != "50" {
				t.Fatalf("%s: Retry-After %q, want 50", tt.name, ra)
			}
		}
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	if _, err := forwardauth.New(forwardauth.Config{}); err == nil {
		t.Fatal("New without Identity and Decider succeeded")
	}
	if _, err := forwardauth.New(forwardauth.Config{Identity: newIdentityFor(t, ""), Decider: service(t, perIP)}); err == nil ||
		!strings.Contains(err.Error(), "forward_auth_headers") {
		t.Fatalf("New with an identity that names no forward_auth_headers: %v, want an error naming it", err)
	}
}

// clientFrom returns an HTTP client whose connections come from the
// loopback address local, so that nginx sees a client other than itself.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestNginx runs the shipped examples/nginx/nginx.conf in a real nginx,
// between clients and an upstream, with auth_request to the forward-auth
// handler: requests pass until the limit, then get 429 with Retry-After,
// and a spoofed X-Forwarded-For does not help.
func TestNginx(t *testing.T) {
	t.Parallel()
	var upstreamHits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	t.Cleanup(upstream.Close)
	// The shipped identity config beside the nginx example.
	idc, err := identity.Load("../../examples/nginx/identity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := forwardauth.New(forwardauth.Config{Identity: id, Decider: service(t, perIP)})
	if err != nil {
		t.Fatal(err)
	}
	sluice := httptest.NewUnstartedServer(h)
	var sluiceConns atomic.Int64 // connections nginx opened to sluice
	sluice.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			sluiceConns.Add(1)
		}
	}
	sluice.Start()
	t.Cleanup(sluice.Close)

	conf, err := os.ReadFile("../../examples/nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	cfg := testenv.Replace(t, string(conf),
		"server 127.0.0.1:8080;", "server "+strings.TrimPrefix(sluice.URL, "http://")+";",
		"server 127.0.0.1:9000;", "server "+strings.TrimPrefix(upstream.URL, "http://")+";",
		"listen 8000;", "listen 127.0.0.1:"+strconv.Itoa(port)+"; access_log off;",
	)
	testenv.Nginx(t, cfg, port)
	base := "http://127.0.0.1:" + strconv.Itoa(port)

	get := func(c *http.Client, path, spoof string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if spoof != "" {
			req.Header.Set("X-Forwarded-For", spoof)
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
	alice, bob := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	for i, spoof := range []string{"", "10.0.0.1", "10.0.0.2"} {
		resp, body := get(alice, "/page", spoof)
		if resp.StatusCode != 200 || body != "hello /page" {
			t.Fatalf("request %d: %d %q, want 200 from the upstream", i+1, resp.StatusCode, body)
		}
		if want := fmt.Sprintf(`"per-ip";r=%d;t=50`, 2-i); resp.Header.Get("RateLimit") != want {
			t.Fatalf("request %d: RateLimit %q, want %q", i+1, resp.Header.Get("RateLimit"), want)
		}
		if resp.Header.Get("RateLimit-Policy") != `"per-ip";q=3;w=60` || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) {
			t.Fatalf("request %d: headers %v", i+1, resp.Header)
		}
	}
	resp, body := get(alice, "/page", "10.0.0.3")
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || ra < 50 || ra > 51 {
		t.Fatalf("over the limit: %d, Retry-After %q; want 429 and 50 or 51", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if want := `{"error":"rate limited","retry_after":` + strconv.Itoa(ra) + "}\n"; body != want {
		t.Fatalf("429 body %q, want %q", body, want)
	}
	if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("RateLimit") != `"per-ip";r=0;t=50` {
		t.Fatalf("429 headers %v", resp.Header)
	}
	if n := upstreamHits.Load(); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}
	if resp, body := get(bob, "/page", ""); resp.StatusCode != 200 || body != "hello /page" {
		t.Fatalf("another client: %d %q, want 200", resp.StatusCode, body)
	}
	// The auth subrequests, one at a time from one nginx worker, share one
	// kept-alive connection to sluice (upstream keepalive, HTTP/1.1 and an
	// empty Connection field in the example), 429s included.
	if n := sluiceConns.Load(); n != 1 {
		t.Fatalf("5 auth subrequests took %d connections to sluice, want 1", n)
	}

	// A header beyond sluice's caps is refused, not let through.
	long := clientFrom("127.0.0.6")
	for range 2 {
		req, err := http.NewRequest(http.MethodGet, base+"/page", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", strings.Repeat("u", 5000))
		resp, err := long.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("a 5,000-byte X-User: %d %q, want 400", resp.StatusCode, b)
		}
	}
	if n := upstreamHits.Load(); n != 4 {
		t.Fatalf("upstream saw %d requests, want 4", n)
	}

	// sluice unreachable: the example fails open.
	sluice.Close()
	if resp, body := get(bob, "/other", ""); resp.StatusCode != 200 || body != "hello /other" {
		t.Fatalf("sluice down: %d %q, want 200 from the upstream (fail open)", resp.StatusCode, body)
	}
}

// TestBodyless: for nginx (X-Original) a 429 carries the rate limit fields
// and no body, so that nginx keeps its connection; for Traefik and Caddy
// (X-Forwarded), which pass a denial on to the client, it has the JSON
// body. A 200 has no body either way. (respond's TestInvalidRequestRefused
// checks that a 400 names the cap on every way in, nginx's included.)
func TestBodyless(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		family  string
		body429 string // how the 429's body begins
	}{
		{identity.ForwardAuthXOriginal, ""},
		{identity.ForwardAuthXForwarded, `{"error":"rate limited","retry_after":`}, // 50 or 51: jitter
	} {
		t.Run(tt.family, func(t *testing.T) {
			t.Parallel()
			h, err := forwardauth.New(forwardauth.Config{Identity: newIdentityFor(t, tt.family), Decider: service(t, perIP)})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			for i, want := range []struct {
				code int
				body string
			}{{200, ""}, {200, ""}, {200, ""}, {429, tt.body429}} {
				req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/auth", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(tt.family+"-Method", "GET")
				req.Header.Set(map[string]string{identity.ForwardAuthXOriginal: "X-Original-URI", identity.ForwardAuthXForwarded: "X-Forwarded-Uri"}[tt.family], "/page")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != want.code || !strings.HasPrefix(string(b), want.body) || (want.body == "") != (len(b) == 0) || resp.ContentLength != int64(len(b)) {
					t.Fatalf("request %d: %d %q (length %d), want %d %q", i+1, resp.StatusCode, b, resp.ContentLength, want.code, want.body)
				}
				if resp.Header.Get("RateLimit-Policy") != `"per-ip";q=3;w=60` {
					t.Fatalf("request %d: RateLimit-Policy %q", i+1, resp.Header.Get("RateLimit-Policy"))
				}
			}
		})
	}
}
