package forwardauth_test

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/transport/forwardauth"
)

// traefikDynamic is the part of Traefik's dynamic configuration the
// recipe sets, decoded strictly so that a misspelt key fails the test.
type traefikDynamic struct {
	HTTP struct {
		Routers map[string]struct {
			EntryPoints []string `yaml:"entryPoints"`
			Rule        string   `yaml:"rule"`
			Middlewares []string `yaml:"middlewares"`
			Service     string   `yaml:"service"`
		} `yaml:"routers"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
		Middlewares map[string]struct {
			ForwardAuth *struct {
				Address             string   `yaml:"address"`
				TrustForwardHeader  *bool    `yaml:"trustForwardHeader"`
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
		} `yaml:"middlewares"`
	} `yaml:"http"`
}

// TestTraefikRecipe checks examples/traefik against what Traefik's
// ForwardAuth does (no Traefik runs here: it cannot be built from the Go
// module proxy, and CI does not install it): the middleware asks sluice's
// /v1/auth, drops the client's X-Forwarded-* and sets its own, and passes
// the client's other headers, X-Original-URI included. The shipped
// identity file then limits POST /login whatever the client adds.
func TestTraefikRecipe(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/traefik/dynamic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var dyn traefikDynamic
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&dyn); err != nil {
		t.Fatal(err)
	}
	app, ok := dyn.HTTP.Routers["app"]
	if !ok || len(app.Middlewares) != 1 {
		t.Fatalf("router app %+v, want one middleware", app)
	}
	if svc := dyn.HTTP.Services[app.Service]; len(svc.LoadBalancer.Servers) != 1 || svc.LoadBalancer.Servers[0].URL != "http://127.0.0.1:9000" {
		t.Fatalf("service %s %+v, want the application at http://127.0.0.1:9000", app.Service, svc)
	}
	fa := dyn.HTTP.Middlewares[app.Middlewares[0]].ForwardAuth
	if fa == nil {
		t.Fatalf("middleware %s is not forwardAuth", app.Middlewares[0])
	}
	u, err := url.Parse(fa.Address)
	if err != nil || u.Path != "/v1/auth" || u.Host != "127.0.0.1:8080" {
		t.Fatalf("forwardAuth address %q, want sluice's http://127.0.0.1:8080/v1/auth", fa.Address)
	}
	if fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
		t.Fatal("trustForwardHeader must be false: Traefik then sets X-Forwarded-* itself")
	}

	idc, err := identity.Load("../../examples/traefik/identity.yaml")
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
	client := sluice.Client() // from 127.0.0.1, Traefik's address in the identity file

	// traefikAsks sends what Traefik's ForwardAuth (trustForwardHeader
	// false) sends for a client request: the client's headers without its
	// X-Forwarded-*, then Traefik's own.
	traefikAsks := func(clientAddr string, orig *http.Request) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, sluice.URL+"/v1/auth", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, vs := range orig.Header {
			req.Header[k] = append([]string(nil), vs...)
		}
		for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port", "X-Real-Ip"} {
			req.Header.Del(k)
		}
		ip, _, err := net.SplitHostPort(clientAddr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", ip)
		req.Header.Set("X-Forwarded-Method", orig.Method)
		req.Header.Set("X-Forwarded-Proto", "http")
		req.Header.Set("X-Forwarded-Host", orig.Host)
		req.Header.Set("X-Forwarded-Uri", orig.URL.RequestURI())
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, want := range []int{200, 429} { // login: 1 a minute
		orig := httptest.NewRequest(http.MethodPost, "http://app.example/login", nil)
		orig.Header.Set("X-User", "bob")
		orig.Header.Set("X-Original-URI", "/other")
		orig.Header.Set("X-Original-Method", "GET")
		orig.Header.Set("X-Forwarded-Uri", "/other")
		orig.Header.Set("X-Forwarded-For", "10.9.9.9")
		if got := traefikAsks("198.51.100.7:5000", orig); got != want {
			t.Fatalf("login %d: %d, want %d", i+1, got, want)
		}
	}
}
