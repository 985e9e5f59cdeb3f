package identity

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestOriginal(t *testing.T) {
	t.Parallel()
	ids := map[string]*Identity{}
	for _, fa := range []string{"", "x-original", "X-Forwarded"} {
		id := mustParse(t, "domain: api\nforward_auth_headers: \""+fa+"\"\n")
		ids[fa] = id
	}
	tests := []struct {
		name    string
		family  string
		headers []string
		method  string
		uri     string // URL.String(), "" to skip
		host    string
		path    string
	}{
		{"nginx", "x-original", []string{"X-Original-Method", "post", "X-Original-URI", "/login?next=%2F", "X-Forwarded-Host", "app.example"}, "POST", "http://app.example/login?next=%2F", "app.example", "/login"},
		{"traefik", "X-Forwarded", []string{"X-Forwarded-Method", "DELETE", "X-Forwarded-Uri", "/v1/items/7", "X-Forwarded-Host", "api.example", "X-Forwarded-Proto", "https"}, "DELETE", "https://api.example/v1/items/7", "api.example", "/v1/items/7"},
		{"nginx ignores X-Forwarded-Uri and -Method", "x-original", []string{"X-Original-URI", "/a", "X-Forwarded-Uri", "/b", "X-Forwarded-Method", "POST"}, "GET", "http://sluice.local/a", "sluice.local", "/a"},
		{"traefik ignores X-Original-URI and -Method", "X-Forwarded", []string{"X-Original-URI", "/a", "X-Original-Method", "POST", "X-Forwarded-Uri", "/b"}, "GET", "http://sluice.local/b", "sluice.local", "/b"},
		{"traefik without its headers: GET /", "X-Forwarded", []string{"X-Original-URI", "/a"}, "GET", "http://sluice.local/", "sluice.local", "/"},
		{"no family: GET /", "", []string{"X-Original-URI", "/a", "X-Forwarded-Uri", "/b"}, "GET", "http://sluice.local/", "sluice.local", "/"},
		{"no headers", "x-original", nil, "GET", "http://sluice.local/", "sluice.local", "/"},
		{"scheme other than http(s) ignored", "x-original", []string{"X-Forwarded-Proto", "gopher"}, "GET", "http://sluice.local/", "sluice.local", "/"},
		{"unreadable URI keeps its path, decoded where it can be", "x-original", []string{"X-Original-URI", "/a b/%6cogin%zz?q=1"}, "GET", "", "sluice.local", "/a b/login%zz"},
		{"relative URI", "X-Forwarded", []string{"X-Forwarded-Uri", "login"}, "GET", "", "sluice.local", "/login"},
		{"a fragment is cut off", "x-original", []string{"X-Original-URI", "/login#x"}, "GET", "http://sluice.local/login", "sluice.local", "/login"},
		{"a fragment after the query", "x-original", []string{"X-Original-URI", "/login?next=%2F#x?y"}, "GET", "http://sluice.local/login?next=%2F", "sluice.local", "/login"},
		{"an unreadable URI's fragment", "X-Forwarded", []string{"X-Forwarded-Uri", "/login%zz#x"}, "GET", "", "sluice.local", "/login%zz"},
		{"%23 is not a fragment", "x-original", []string{"X-Original-URI", "/login%23x"}, "GET", "", "sluice.local", "/login#x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "http://sluice.local/v1/auth", nil)
			for i := 0; i+1 < len(tt.headers); i += 2 {
				r.Header.Set(tt.headers[i], tt.headers[i+1])
			}
			o := ids[tt.family].Original(r)
			if o.Method != tt.method || o.Host != tt.host || o.URL.Path != tt.path {
				t.Fatalf("got %s %s host %s path %q", o.Method, o.URL, o.Host, o.URL.Path)
			}
			if tt.uri != "" && o.URL.String() != tt.uri {
				t.Fatalf("URL %s, want %s", o.URL, tt.uri)
			}
			if r.URL.Path != "/v1/auth" || r.Method != http.MethodGet {
				t.Fatalf("the auth request was modified: %s %s", r.Method, r.URL)
			}
		})
	}
	if got := ids["x-original"].ForwardAuthHeaders(); got != ForwardAuthXOriginal {
		t.Fatalf("ForwardAuthHeaders = %q", got)
	}
	if got := ids[""].ForwardAuthHeaders(); got != "" {
		t.Fatalf("ForwardAuthHeaders = %q, want none", got)
	}
	if _, err := Parse("test.yaml", []byte("domain: api\nforward_auth_headers: traefik\n")); err == nil ||
		!strings.Contains(err.Error(), "test.yaml:2: forward_auth_headers: want X-Original (nginx auth_request) or X-Forwarded (Traefik, Caddy)") {
		t.Fatalf("unknown family: %v", err)
	}
}

// FuzzOriginal feeds arbitrary method and URI headers: the rebuilt request
// always has a path starting with a slash that the path actions can read,
// a method, and a URL that formats.
func FuzzOriginal(f *testing.F) {
	f.Add("POST", "/login?x=1")
	f.Add("", "/a b/%zz?q")
	f.Add("get", "login;%6")
	f.Add("x", "//%2e%2e/%")
	id, err := New(Config{Domain: "d", ForwardAuthHeaders: "X-Original"}, nil, WithLogger(quiet))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, uri string) {
		r := &http.Request{Method: http.MethodGet, Host: "h", RemoteAddr: "127.0.0.1:1",
			Header: http.Header{"X-Original-Method": {method}, "X-Original-Uri": {uri}}}
		o := id.Original(r)
		if !strings.HasPrefix(o.URL.Path, "/") || o.Method == "" {
			t.Fatalf("%q %q: method %q path %q", method, uri, o.Method, o.URL.Path)
		}
		_ = o.URL.String()
		_ = normalizePath(o.URL.Path)
	})
}
