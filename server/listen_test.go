package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/testenv"
)

// httpsGet GETs url with roots trusted and client's certificate, if any.
func httpsGet(t *testing.T, url string, roots *x509.CertPool, client *tls.Certificate) (int, string, error) {
	t.Helper()
	tc := &tls.Config{RootCAs: roots}
	if client != nil {
		tc.Certificates = []tls.Certificate{*client}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestServeTLS serves gRPC, HTTP and an ops listener over mutual TLS:
// clients with a certificate of the client CA are answered, others are
// refused, and a new server certificate is presented from the next
// connection on without a restart.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	certPath, keyPath, caPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	first := authority.Issue(t, false, "sluice.test")
	first.Write(t, certPath, keyPath)
	testenv.ReplaceFile(t, caPath, authority.PEM)
	client := authority.Issue(t, true, "envoy").Pair(t)

	c := testConfig(exampleRules)
	c.OpsAddrs = []string{"127.0.0.1:0"}
	c.TLS = TLSConfig{Cert: certPath, Key: keyPath, ClientCA: caPath}
	s := startServer(t, c)
	rec := s.logs.Find("listening")
	if rec["tls"] != true {
		t.Fatalf("listening without TLS: %v", rec)
	}
	httpAddr, _ := rec["http_addr"].(string)
	opsAddr, _ := rec["ops_addr"].(string)

	// gRPC with the client certificate: a decision and Envoy's health name.
	grpcSerial := func() *big.Int {
		t.Helper()
		creds := credentials.NewTLS(&tls.Config{RootCAs: authority.Pool(), Certificates: []tls.Certificate{*client}})
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var p peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "192.0.2.1")},
		}, grpc.Peer(&p))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit over TLS = %v, %v", resp, err)
		}
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of ratelimit over TLS = %v, %v", h, err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber
	}
	if got := grpcSerial(); got.Cmp(first.Serial) != 0 {
		t.Errorf("gRPC presented serial %v, want %v", got, first.Serial)
	}

	for _, url := range []string{"https://" + httpAddr + "/healthz", "https://" + opsAddr + "/metrics", "https://" + opsAddr + "/healthcheck"} {
		if code, body, err := httpsGet(t, url, authority.Pool(), client); err != nil || code != 200 {
			t.Errorf("GET %s with a client certificate = %d %.80s, %v", url, code, body, err)
		}
		if _, _, err := httpsGet(t, url, authority.Pool(), nil); err == nil {
			t.Errorf("GET %s without a client certificate succeeded", url)
		}
	}
	if _, _, err := httpsGet(t, "https://"+opsAddr+"/v1/decide", authority.Pool(), client); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := httpsGet(t, "https://"+opsAddr+"/v1/rules", authority.Pool(), client); code != 404 {
		t.Errorf("the ops listener serves /v1/rules (%d): it is for health and metrics only", code)
	}

	// A new certificate: the next connection presents it.
	second := authority.Issue(t, false, "sluice.test")
	second.Write(t, certPath, keyPath)
	if got := grpcSerial(); got.Cmp(second.Serial) != 0 {
		t.Errorf("after the files changed, gRPC presented serial %v, want %v", got, second.Serial)
	}
}

// TestTLSRefusals checks the TLS settings New refuses.
func TestTLSRefusals(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	authority.Issue(t, false, "sluice.test").Write(t, certPath, keyPath)
	for name, tc := range map[string]TLSConfig{
		"client CA without a certificate": {ClientCA: certPath},
		"certificate without a key":       {Cert: certPath},
		"unknown listener":                {Cert: certPath, Key: keyPath, Listeners: []string{"grpc", "nosuch"}},
		"the proxy's listener on serve":   {Cert: certPath, Key: keyPath, Listeners: []string{"proxy"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := testConfig(exampleRules)
			c.TLS = tc
			wantConfigError(t, c)
		})
	}
}

// TestProxyOps checks that the proxy serves health, readiness, Envoy's
// health check and metrics on its ops listener, and not on its own.
func TestProxyOps(t *testing.T) {
	t.Parallel()
	cfg := testConfig(exampleRules)
	cfg.Proxy = &ProxyConfig{Upstream: httptestServer(t), Listen: "127.0.0.1:0"}
	cfg.OpsAddrs = []string{"127.0.0.1:0"}
	s := startServer(t, cfg)
	rec := s.logs.Find("proxying")
	opsAddr, _ := rec["ops_addr"].(string)
	listen, _ := rec["listen"].(string)
	c := &http.Client{Timeout: 10 * time.Second}
	get := func(url string) (int, string) {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for path, want := range map[string]string{
		"/healthz":      `"status":"ok"`,
		"/readyz":       `"status":"ready"`,
		"/healthcheck":  "OK",
		"/metrics":      "sluice_rules_reloads_total",
		"/ui/":          "app.js", // the dashboard (issue 16)
		"/ui/api/stats": `"decisions"`,
		"/v1/top":       `"counted":false`,
	} {
		if code, body := get("http://" + opsAddr + path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("ops GET %s = %d %.200s, want 200 with %s", path, code, body, want)
		}
	}
	// The proxied service sees /metrics: the proxy's own listener is its.
	if code, body := get("http://" + listen + "/metrics"); code != 200 || !strings.Contains(body, "upstream") {
		t.Errorf("proxied GET /metrics = %d %.80s, want the upstream's answer", code, body)
	}
	c.CloseIdleConnections()
}

// httptestServer returns the URL of a service that answers "upstream" and
// the path; it stops when the test ends.
func httptestServer(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream "+r.URL.Path) //nolint:errcheck // a test server
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// TestListenerErrors checks that a listener that cannot listen is named
// in New's error by the flag that sets it and its address, followed by the
// system's reason ("--http-addr 127.0.0.1:8080: address already in use");
// it said "listen HTTP: listen tcp ..." without the flag (issue 35).
func TestListenerErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	dir := t.TempDir()
	rulesDir, tokens := filepath.Join(dir, "rules"), filepath.Join(dir, "tokens")
	rules, err := os.ReadFile(exampleRules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(rulesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rulesDir, "api.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte("ops write s3cr3t-s3cr3t-s3cr3t-s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		flag string
		set  func(*Config)
	}{
		{"--grpc-addr", func(c *Config) { c.GRPC.Addr = addr }},
		{"--http-addr", func(c *Config) { c.HTTP.Addr = addr }},
		{"--ops-addr", func(c *Config) { c.OpsAddrs = []string{addr} }},
		{"--ui-addr", func(c *Config) { c.UI.Addr = addr }},
		{"--admin-addr", func(c *Config) {
			c.Rules.Source = rulesDir
			c.Admin.Tokens, c.Admin.Addr = tokens, addr
		}},
		{"--listen", func(c *Config) { c.Proxy = &ProxyConfig{Upstream: "http://127.0.0.1:1", Listen: addr} }},
	} {
		c := testConfig(exampleRules)
		tt.set(&c)
		srv, _, err := newServer(c)
		if err == nil {
			srv.Close()
			t.Fatalf("%s: New listened on a busy address", tt.flag)
		}
		want := tt.flag + " " + addr + ": address already in use"
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: New: %v; want it to start with %q", tt.flag, err, want)
		}
		var le *ListenError
		if !errors.As(err, &le) || !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("%s: New: %v is no *ListenError wrapping EADDRINUSE", tt.flag, err)
		}
	}
}
