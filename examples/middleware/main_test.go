package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// TestLimited serves the example behind a real HTTP server: five logins a
// minute pass for a user, the sixth gets 429 with the rate limit fields.
func TestLimited(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	h, store, err := limited("../rules.yaml", "../nginx/identity.yaml", hello)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for i := 1; i <= 6; i++ {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/login", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, wantBody := http.StatusOK, "hello\n"
		if i == 6 {
			want, wantBody = http.StatusTooManyRequests, ""
		}
		if resp.StatusCode != want || (wantBody != "" && string(body) != wantBody) || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("login %d: %d %q RateLimit %q, want %d", i, resp.StatusCode, body, resp.Header.Get("RateLimit"), want)
		}
	}
	if _, _, err := limited("../rules.yaml", "missing.yaml", hello); err == nil {
		t.Fatal("limited with a missing identity file succeeded")
	}
}

// TestREADME: the middleware snippet of docs/ways-in.md is this file, as it is.
func TestREADME(t *testing.T) {
	readme, err := os.ReadFile("../../docs/ways-in.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, append(append([]byte("```go\n"), src...), "```\n"...)) {
		t.Fatal("docs/ways-in.md does not show examples/middleware/main.go as it is, in a ```go block")
	}
}
