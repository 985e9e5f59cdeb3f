package forwardauth_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/transport/forwardauth"
)

// loginRules limits each user's logins to 2 a minute.
const loginRules = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 2}
`

// TestNginxFragment: a fragment in the request line (GET /login#x, which
// nginx's locations see as /login) counts as /login behind the shipped
// nginx recipe, which sends sluice the URI without it (before,
// $request_uri sent the fragment and each spelling had a counter of its
// own); sluice cuts it off too.
func TestNginxFragment(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var upstreamPaths, sentURIs []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamPaths = append(upstreamPaths, r.URL.Path)
		mu.Unlock()
	}))
	t.Cleanup(upstream.Close)
	idc, err := identity.Load("../../examples/nginx/identity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(idc, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := forwardauth.New(forwardauth.Config{Identity: id, Decider: service(t, loginRules)})
	if err != nil {
		t.Fatal(err)
	}
	sluice := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sentURIs = append(sentURIs, r.Header.Get("X-Original-URI"))
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(sluice.Close)
	conf, err := os.ReadFile("../../examples/nginx/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	testenv.Nginx(t, testenv.Replace(t, string(conf),
		"server 127.0.0.1:8080;", "server "+strings.TrimPrefix(sluice.URL, "http://")+";",
		"server 127.0.0.1:9000;", "server "+strings.TrimPrefix(upstream.URL, "http://")+";",
		"listen 8000;", "listen 127.0.0.1:"+strconv.Itoa(port)+"; access_log off;",
	), port)
	// Raw request lines: Go's client would cut the fragment itself.
	get := func(target string) int {
		t.Helper()
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: app.example\r\nX-User: bob\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, c := range []struct {
		target string
		code   int
	}{
		{"/login", 200},
		{"/login#x", 200},
		{"/login#y", 429},
		{"/login?next=/#z", 429},
	} {
		if got := get(c.target); got != c.code {
			t.Errorf("request %d, GET %s: %d, want %d", i+1, c.target, got, c.code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// nginx passes the request line on as it came (the application decides
	// what #x means; most cut it off): two reached it, two were denied.
	if len(upstreamPaths) != 2 {
		t.Errorf("the application saw %q", upstreamPaths)
	}
	for _, u := range sentURIs {
		if strings.Contains(u, "#") {
			t.Errorf("the recipe sent X-Original-URI %q, with the fragment", u)
		}
	}
}
