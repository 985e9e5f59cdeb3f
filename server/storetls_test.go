package server

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// freePort returns a TCP port free on loopback a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tlsStore returns the Config of a test server with the example rules on
// the store at url with the TLS of tc, FailClosed; nearCache is
// stack.Config.NearCache.
func tlsStore(url string, tc StoreTLSConfig, nearCache int64) Config {
	c := testConfig(exampleRules)
	c.Store.URL, c.Store.NearCache, c.StoreTLS, c.Fail = url, nearCache, tc, decide.FailClosed
	return c
}

// TestStoreTLS runs a server on a Redis that speaks TLS only on the port
// it is given, with a certificate of a CA made in the test: StoreTLS.CA
// makes decisions come from it; without it the certificate is refused;
// and a URL whose host the certificate does not name needs
// SkipHostnameVerification.
func TestStoreTLS(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "redis CA")
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	authority.Issue(t, false, "redis.test").Write(t, p("redis.crt"), p("redis.key")) // and 127.0.0.1, not localhost
	if err := os.WriteFile(p("ca.crt"), authority.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(freePort(t))
	testenv.StartRedis(t, "--tls-port", port, "--tls-cert-file", p("redis.crt"), "--tls-key-file", p("redis.key"),
		"--tls-ca-cert-file", p("ca.crt"), "--tls-auth-clients", "no")

	const body = `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.9"}]}]}`
	decidesFromStore := func(t *testing.T, s *testServer) {
		t.Helper()
		// FailClosed denies until the store answers: an OK comes from it.
		eventually(t, "a decision from the TLS store", func() bool {
			r := s.do(t, "POST", "/v1/decide", body)
			return r.code == 200 && strings.Contains(r.body, `"overallCode":"OK"`)
		})
	}
	t.Run("with the CA", func(t *testing.T) {
		t.Parallel()
		c := tlsStore("rediss://127.0.0.1:"+port, StoreTLSConfig{CA: p("ca.crt")}, -1)
		s := startServer(t, c)
		decidesFromStore(t, s)
	})
	t.Run("another host name, not verified", func(t *testing.T) {
		t.Parallel()
		c := tlsStore("rediss://localhost:"+port, StoreTLSConfig{CA: p("ca.crt"), SkipHostnameVerification: true}, -1)
		s := startServer(t, c)
		decidesFromStore(t, s)
	})
	for name, tc := range map[string]struct {
		url string
		tls StoreTLSConfig
	}{
		"without the CA":    {url: "rediss://127.0.0.1:" + port},
		"another host name": {url: "rediss://localhost:" + port, tls: StoreTLSConfig{CA: p("ca.crt")}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, tlsStore(tc.url, tc.tls, 0))
			eventually(t, "the store refused", func() bool {
				return s.logs.FindFunc(notConnected, errContains("certificate")) != nil
			})
			if r := s.do(t, "POST", "/v1/decide", body); !strings.Contains(r.body, `"overallCode":"OVER_LIMIT"`) {
				t.Errorf("decision without a trusted store = %d %s, want OVER_LIMIT by FailClosed", r.code, r.body)
			}
		})
	}
}

// TestStoreTLSRefusals checks the refusals of the store's TLS settings.
func TestStoreTLSRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]StoreTLSConfig{
		"not rediss":       {CA: empty},
		"no certificate":   {CA: empty},
		"missing CA":       {CA: filepath.Join(dir, "nope.pem")},
		"cert without key": {Cert: empty},
	} {
		spec := "rediss://r:6379"
		if name == "not rediss" {
			spec = "redis://r:6379"
		}
		var ce *ConfigError
		if _, err := f.config(spec); !errors.As(err, &ce) {
			t.Errorf("%s: config = %v, want a *ConfigError", name, err)
		}
	}
	if c, err := (StoreTLSConfig{}).config("redis://r:6379"); c != nil || err != nil {
		t.Errorf("no settings: config = %v, %v; want the defaults", c, err)
	}
}

// notConnected is the log message of a store that does not connect.
const notConnected = "store not connected; deciding by --fail until it is"

// errContains returns a test of a log record: its err holds sub.
func errContains(sub string) func(map[string]any) bool {
	return func(rec map[string]any) bool {
		err, _ := rec["err"].(string)
		return strings.Contains(err, sub)
	}
}

// TestStoreNotConnectedLogsNewCause: a server logs the store's first failure
// to connect and then every new cause at once, not only once a minute:
// here a port where nothing listens yet (refused), then a Redis there
// whose certificate serve does not trust. Before, a first attempt that
// timed out on a busy machine hid the certificate for a minute.
func TestStoreNotConnectedLogsNewCause(t *testing.T) {
	t.Parallel()
	authority := testenv.NewCA(t, "redis CA")
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	authority.Issue(t, false, "redis.test").Write(t, p("redis.crt"), p("redis.key"))
	if err := os.WriteFile(p("ca.crt"), authority.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(testenv.FreePort(t))
	s := startServer(t, tlsStore("rediss://127.0.0.1:"+port, StoreTLSConfig{}, 0))
	eventually(t, "the refused connection logged", func() bool {
		return s.logs.FindFunc(notConnected, errContains("refused")) != nil
	})
	testenv.StartRedis(t, "--tls-port", port, "--tls-cert-file", p("redis.crt"), "--tls-key-file", p("redis.key"),
		"--tls-ca-cert-file", p("ca.crt"), "--tls-auth-clients", "no")
	eventually(t, "the untrusted certificate logged", func() bool {
		return s.logs.FindFunc(notConnected, errContains("certificate")) != nil
	})
}
