package identity

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The header families of forward_auth_headers.
const (
	// ForwardAuthXOriginal is nginx's auth_request recipe: X-Original-Method
	// and X-Original-URI.
	ForwardAuthXOriginal = "X-Original"
	// ForwardAuthXForwarded is what Traefik's ForwardAuth and Caddy's
	// forward_auth send: X-Forwarded-Method and X-Forwarded-Uri.
	ForwardAuthXForwarded = "X-Forwarded"
)

// forwardAuth is the headers one family reads the original request from.
type forwardAuth struct {
	family string // ForwardAuthXOriginal or ForwardAuthXForwarded; "" for none
	method string // canonical header keys
	uri    string
}

// parseForwardAuth reads a forward_auth_headers value, in any case.
func parseForwardAuth(s string) (forwardAuth, error) {
	switch strings.ToLower(s) {
	case "":
		return forwardAuth{}, nil
	case "x-original":
		return forwardAuth{family: ForwardAuthXOriginal, method: "X-Original-Method", uri: "X-Original-Uri"}, nil
	case "x-forwarded":
		return forwardAuth{family: ForwardAuthXForwarded, method: "X-Forwarded-Method", uri: "X-Forwarded-Uri"}, nil
	}
	return forwardAuth{}, fmt.Errorf("want X-Original (nginx auth_request) or X-Forwarded (Traefik, Caddy), got %q", s)
}

// ForwardAuthHeaders returns the family of headers Original reads,
// ForwardAuthXOriginal or ForwardAuthXForwarded, or "" when the
// configuration names none and Original cannot be used.
func (id *Identity) ForwardAuthHeaders() string { return id.fwdAuth.family }

// Original returns the request that a forward-auth call r is about,
// rebuilt from the headers forward_auth_headers names and no others: the
// method from X-Original-Method or X-Forwarded-Method, the URI from
// X-Original-URI or X-Forwarded-Uri; for both families the host from
// X-Forwarded-Host and the scheme from X-Forwarded-Proto. A client's own
// copy of the other family's headers changes nothing; the proxy must set
// (not pass on) the named ones. Fields with no header get the method GET,
// the path / and r's host; headers and the peer address are r's, so the
// client's address is judged against the trusted proxies as for any
// request. With no family configured only those defaults apply. r is not
// modified.
func (id *Identity) Original(r *http.Request) *http.Request {
	o := r.WithContext(r.Context())
	o.Method = http.MethodGet
	u := &url.URL{Path: "/"}
	if fa := id.fwdAuth; fa.family != "" {
		if m := firstValue(r.Header, fa.method); m != "" {
			o.Method = strings.ToUpper(m)
		}
		if raw := firstValue(r.Header, fa.uri); raw != "" {
			u = parseURI(raw)
		}
	}
	o.Host = r.Host
	if host := firstValue(r.Header, "X-Forwarded-Host"); host != "" {
		o.Host = host
	}
	u.Host = o.Host
	u.Scheme = "http"
	if p := firstValue(r.Header, "X-Forwarded-Proto"); p == "https" || p == "http" {
		u.Scheme = p
	}
	o.URL = u
	o.RequestURI = u.RequestURI()
	return o
}

// firstValue returns the first value of the canonical header key, or "".
func firstValue(h http.Header, key string) string {
	if vs := h[key]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// parseURI reads a request target without its fragment (nginx's
// $request_uri keeps one: GET /login#x, routed to /login). One that does
// not parse (a bad percent-escape) keeps its path, decoded where it can
// be, so that a path limit still sees it.
func parseURI(raw string) *url.URL {
	raw, _, _ = strings.Cut(raw, "#")
	if u, err := url.ParseRequestURI(raw); err == nil {
		if !strings.HasPrefix(u.Path, "/") { // "*", or an absolute URL without a path
			return &url.URL{Path: "/" + u.Path, RawQuery: u.RawQuery}
		}
		return &url.URL{Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
	}
	p, q, _ := strings.Cut(raw, "?")
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return &url.URL{Path: lenientUnescape(p), RawQuery: q}
}

// lenientUnescape decodes the valid %XX escapes of s and keeps the rest.
func lenientUnescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
