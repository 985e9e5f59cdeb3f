package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// maxCallAlloc is the most one call of any listener may allocate: the
// largest body a route reads (the JSON API's 1 MiB, the admin API's 4
// MiB), decoded, or the costliest simulation (about 9 MB), with room.
const maxCallAlloc = 48 << 20

// FuzzListeners sends any method, path, query, two headers and body to
// every HTTP listener of two real servers, as FuzzRequest does to the
// admin API: one serving the dashboard beside the HTTP API, forward-auth
// (nginx's headers) and the ops routes, the other the dashboard on its
// own listener behind the admin tokens, and the admin API. No call is
// answered 500 or allocates more than maxCallAlloc; the dashboard behind
// the tokens answers nothing but 401 without one.
func FuzzListeners(f *testing.F) {
	dir := f.TempDir()
	writeFile(f, filepath.Join(dir, "rules.yaml"), dashboardRules)
	tokens := filepath.Join(f.TempDir(), "tokens")
	writeFile(f, tokens, "rita read rita-secret-0123456789\n")
	open := testConfig(dir)
	open.Identity = "../examples/nginx/identity.yaml"
	closed := testConfig(dir)
	closed.UI = UIConfig{Addr: "127.0.0.1:0", Auth: true}
	closed.Admin.Tokens, closed.Admin.Addr = tokens, "127.0.0.1:0"
	var handlers []http.Handler
	for _, c := range []Config{open, closed} {
		srv, logs, err := newServer(c)
		if err != nil {
			f.Fatalf("New: %v\n%s", err, logs)
		}
		f.Cleanup(func() { srv.Close() })
		if api, ok := srv.front.(*serveFront); ok && c.UI.Addr == "" {
			handlers = append(handlers, api.api)
		}
		handlers = append(handlers, srv.ops)
		if srv.ui != nil {
			handlers = append(handlers, srv.ui, srv.admin)
		}
	}
	// handlers: 0 the open HTTP API, 1 its ops, 2 the closed server's
	// ops, 3 its dashboard, 4 its admin API.
	const closedUI = 3
	if len(handlers) != 5 {
		f.Fatalf("%d handlers", len(handlers))
	}
	for _, s := range []struct {
		target, method uint8
		path, h1, v1   string
		body           string
	}{
		{0, 1, "/v1/decide", "Content-Type", "application/json", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`},
		{0, 0, "/v1/auth", "X-Original-URI", "/login#x?y", ""},
		{0, 0, "/v1/auth", "X-Forwarded-For", "1.2.3.4, ::1", ""},
		{0, 0, "/v1/keys/api/user/bob", "", "", ""},
		{0, 0, "/v1/top?domain=api&key=user&window=1h&n=5", "", "", ""},
		{0, 1, "/ui/api/simulate", "", "", `{"rules":"domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n","traffic":"clients 1000; burst 50000"}`},
		{0, 0, "/ui/api/stats", "", "", ""},
		{0, 0, "/v1/rules", "", "", ""},
		{1, 0, "/metrics", "", "", ""},
		{1, 0, "/readyz", "", "", ""},
		{3, 0, "/ui/", "Authorization", "Basic cml0YTpyaXRhLXNlY3JldC0wMTIzNDU2Nzg5", ""},
		{3, 1, "/ui/api/simulate", "Authorization", "Bearer rita-secret-0123456789", `{"traffic":"burst 1"}`},
		{4, 0, "/v1/admin/domains", "Authorization", "Bearer rita-secret-0123456789", ""},
	} {
		f.Add(s.target, s.method, s.path, s.h1, s.v1, "", "", []byte(s.body))
	}
	methods := []string{"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"}
	f.Fuzz(func(t *testing.T, target, method uint8, path, h1, v1, h2, v2 string, body []byte) {
		u, err := url.Parse(path)
		if err != nil || !strings.HasPrefix(path, "/") {
			return
		}
		i := int(target) % len(handlers)
		req := httptest.NewRequest(methods[int(method)%len(methods)], "http://sluice/", bytes.NewReader(body))
		req.URL.Path, req.URL.RawPath, req.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
		req.RequestURI = u.RequestURI()
		for _, h := range [][2]string{{h1, v1}, {h2, v2}} {
			if h[0] != "" && validHeader(h[0], h[1]) {
				req.Header.Add(h[0], h[1])
			}
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		w := httptest.NewRecorder()
		handlers[i].ServeHTTP(w, req)
		runtime.ReadMemStats(&after)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("handler %d: %s %s: %d %.300s", i, req.Method, path, w.Code, w.Body)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > maxCallAlloc {
			t.Fatalf("handler %d: %s %s allocated %d bytes", i, req.Method, path, n)
		}
		authorized := strings.Contains(req.Header.Get("Authorization"), "rita-secret-0123456789") ||
			strings.Contains(req.Header.Get("Authorization"), "cml0YTpyaXRhLXNlY3JldC0wMTIzNDU2Nzg5")
		// Without a token: 401, or what the mux answers before the
		// dashboard (no route, a redirect to the cleaned path).
		if i == closedUI && !authorized && w.Code != http.StatusUnauthorized && w.Code != http.StatusNotFound &&
			w.Code != http.StatusMethodNotAllowed && w.Code != http.StatusTemporaryRedirect && w.Code != http.StatusMovedPermanently {
			t.Fatalf("the dashboard behind tokens: %s %s without one: %d", req.Method, path, w.Code)
		}
	})
}

// validHeader reports whether name and value can be sent as a header.
func validHeader(name, value string) bool {
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) {
			return false
		}
	}
	return !strings.ContainsAny(value, "\r\n\x00")
}
