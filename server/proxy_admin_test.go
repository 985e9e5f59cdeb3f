package server

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// testWriteSecret is the secret of the admin API's write token in tests.
const testWriteSecret = "ops-secret-0123456789abcdef"

// edgeDoc is the rules of the proxy's default identity (one limit per
// client IP in domain edge) at n an hour.
func edgeDoc(n int) string {
	return "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: " + strconv.Itoa(n) + "}\n"
}

// TestProxyAdmin: the proxy serves the admin API as serve does (its
// settings, its TLS): a rule changed through it and an override set and
// deleted through it are enforced by the proxy.
func TestProxyAdmin(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	dir, rulesDir := t.TempDir(), t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	authority.Issue(t, false, "sluice.test").Write(t, certPath, keyPath)
	tokens := filepath.Join(dir, "tokens")
	writeFile(t, tokens, "ops write "+testWriteSecret+"\n")
	writeFile(t, filepath.Join(rulesDir, "edge.yaml"), edgeDoc(1))
	up := httptestServer(t)

	c := testConfig(rulesDir)
	c.Proxy = &ProxyConfig{Upstream: up, Domain: "edge", Listen: "127.0.0.1:0"}
	c.Admin = AdminConfig{Tokens: tokens, Addr: "127.0.0.1:0"}
	c.TLS = TLSConfig{Cert: certPath, Key: keyPath, Listeners: []string{"admin"}}
	s := startServer(t, c)
	proxyAddr, adminAddr := s.srv.HTTPAddr(), s.srv.AdminAddr()

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func() int {
		t.Helper()
		resp, err := client.Get("http://" + proxyAddr + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained for reuse
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := get(), get(); a != 200 || b != 429 {
		t.Fatalf("at 1 an hour: %d then %d, want 200 then 429", a, b)
	}

	admin := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: authority.Pool()}}}
	defer admin.CloseIdleConnections()
	call := func(method, path, secret, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "https://"+adminAddr+path, bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := admin.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call("PUT", "/v1/admin/domains/edge", "", edgeDoc(1000)); code != 401 {
		t.Fatalf("PUT without a token: %d %s", code, body)
	}
	if resp, err := client.Get("http://" + adminAddr + "/v1/admin/domains"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("the admin API answered plain HTTP with TLS on the admin listener")
		}
	}

	// A rule changed through the admin API.
	if code, body := call("PUT", "/v1/admin/domains/edge", testWriteSecret, edgeDoc(1000)); code != 200 {
		t.Fatalf("PUT edge: %d %s", code, body)
	}
	if b, err := os.ReadFile(filepath.Join(rulesDir, "edge.yaml")); err != nil || string(b) != edgeDoc(1000) {
		t.Fatalf("edge.yaml: %q, %v", b, err)
	}
	eventually(t, "the proxy enforcing 1000 an hour", func() bool { return get() == 200 })

	// An override through it: the client blocked, then not.
	ov := `{"domain":"edge","entries":[{"key":"remote_address","value":"127.0.0.1"}],"rate_limits":[{"unit":"hour","requests_per_unit":0}]}`
	if code, body := call("PUT", "/v1/admin/overrides", testWriteSecret, ov); code != 200 {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	eventually(t, "the proxy enforcing the block", func() bool { return get() == 429 })
	id := control.OverrideID("edge", []rules.Entry{{Key: "remote_address", Value: "127.0.0.1"}})
	if code, body := call("DELETE", "/v1/admin/overrides/"+url.PathEscape(id), testWriteSecret, ""); code/100 != 2 {
		t.Fatalf("DELETE override: %d %s", code, body)
	}
	eventually(t, "the proxy enforcing the rule again", func() bool { return get() == 200 })
}
