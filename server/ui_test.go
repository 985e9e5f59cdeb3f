package server

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestUIAddr: the dashboard (/ui, its simulator, /v1/top, /v1/keys) is
// beside the HTTP API by default, alone on --ui-addr when given, nowhere
// with --ui-addr none, and asks for an admin token with --ui-auth (401,
// then 200 with the token as Basic's password or a bearer token); the
// decision API stays open.
func TestUIAddr(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), dashboardRules)
	tokens := writeTemp(t, "tokens", "rita read rita-secret-0123456789\n")
	get := func(t *testing.T, url, auth string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		switch {
		case strings.HasPrefix(auth, "basic:"):
			req.SetBasicAuth("rita", strings.TrimPrefix(auth, "basic:"))
		case auth != "":
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	paths := []string{"/ui/", "/ui/api/stats", "/v1/top?domain=api&key=user", "/v1/keys/api/user/bob"}
	for _, tc := range []struct {
		name         string
		addr         string
		auth         bool
		onAPI, onOwn int // the status of the paths there (0: no such listener)
		withToken    int
	}{
		{"default", "", false, 200, 0, 0},
		{"own listener", "127.0.0.1:0", false, 404, 200, 0},
		{"none", NoAddr, false, 404, 0, 0},
		{"own listener with auth", "127.0.0.1:0", true, 404, 401, 200},
		{"beside the API with auth", "", true, 401, 0, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(dir)
			c.UI = UIConfig{Addr: tc.addr, Auth: tc.auth}
			if tc.auth {
				c.Admin.Tokens, c.Admin.Addr = tokens, "127.0.0.1:0"
			}
			s := startServer(t, c)
			own := ""
			if a := s.srv.UIAddr(); a != "" {
				own = "http://" + a
			}
			if (own != "") != (tc.onOwn != 0) {
				t.Fatalf("UIAddr %q", own)
			}
			for _, p := range paths {
				if got := get(t, s.httpURL+p, ""); got != tc.onAPI {
					t.Errorf("HTTP API %s: %d, want %d", p, got, tc.onAPI)
				}
				base := s.httpURL
				if own != "" {
					base = own
					if got := get(t, own+p, ""); got != tc.onOwn {
						t.Errorf("own listener %s: %d, want %d", p, got, tc.onOwn)
					}
				}
				if tc.withToken != 0 {
					for _, a := range []string{"basic:rita-secret-0123456789", "rita-secret-0123456789"} {
						if got := get(t, base+p, a); got != tc.withToken {
							t.Errorf("%s with a token (%s): %d, want %d", p, a[:5], got, tc.withToken)
						}
					}
					if got := get(t, base+p, "basic:wrong-secret-0123456789"); got != 401 {
						t.Errorf("%s with a wrong token: %d", p, got)
					}
				}
			}
			if code, err := decideUser(s.http, s.httpURL, "bob"); err != nil || code != "OK" {
				t.Errorf("the decision API: %s %v", code, err)
			}
		})
	}
	wantConfigError(t, func() Config { c := testConfig(dir); c.UI.Auth = true; return c }(), "--ui-auth", "--admin-tokens")
}
