package identity

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/sluicehq/sluice/rules"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func fixedNow() time.Time { return t0 }

func mustParse(t *testing.T, doc string) *Identity {
	t.Helper()
	c, err := Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	id, err := New(c, fixedNow, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// quiet discards the warnings an Identity logs.
var quiet = slog.New(slog.DiscardHandler)

func request(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://api.example/v1/messages?x=1", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestClientAddr(t *testing.T) {
	t.Parallel()
	id := mustParse(t, `
domain: api
trusted_proxies: [10.0.0.0/8, "127.0.0.1", "fd00::/8"]
rate_limits: [{actions: [{remote_address: {}}]}]
`)
	tests := []struct {
		name    string
		remote  string
		headers []string
		want    string
	}{
		{"peer without headers", "203.0.113.7:5555", nil, "203.0.113.7"},
		{"spoofed XFF from an untrusted peer is ignored", "203.0.113.7:5555", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"spoofed Forwarded from an untrusted peer is ignored", "203.0.113.7:5555", []string{"Forwarded", "for=198.51.100.1"}, "203.0.113.7"},
		{"trusted proxy: the hop it saw", "10.1.2.3:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"trusted proxy: a client's own XFF entry is left of the real one", "10.1.2.3:80", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		{"two trusted hops are skipped from the right", "127.0.0.1:80", []string{"X-Forwarded-For", "198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"several XFF header lines read as one list", "127.0.0.1:80", []string{"X-Forwarded-For", "6.6.6.6, 198.51.100.1", "X-Forwarded-For", "10.0.0.1"}, "198.51.100.1"},
		{"all hops trusted: the leftmost", "127.0.0.1:80", []string{"X-Forwarded-For", "10.0.0.2, 10.0.0.1"}, "10.0.0.2"},
		{"garbage hop: the last trusted one read", "127.0.0.1:80", []string{"X-Forwarded-For", "nonsense, 10.0.0.1"}, "10.0.0.1"},
		{"garbage left of a real client is never reached", "127.0.0.1:80", []string{"X-Forwarded-For", "nonsense, 198.51.100.1"}, "198.51.100.1"},
		{"trusted proxy, no header: the peer", "10.1.2.3:80", nil, "10.1.2.3"},
		{"XFF with ports", "127.0.0.1:80", []string{"X-Forwarded-For", "198.51.100.1:4000"}, "198.51.100.1"},
		{"IPv6 peer grouped by /64", "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 neighbours share the /64", "[2001:db8:1:2:ffff::9]:443", nil, "2001:db8:1:2::/64"},
		{"IPv4-mapped IPv6 is IPv4", "[::ffff:203.0.113.7]:443", nil, "203.0.113.7"},
		{"trusted IPv6 proxy", "[fd00::1]:80", []string{"X-Forwarded-For", "2001:db8::5"}, "2001:db8::/64"},
		{"no address (unix socket): no descriptor", "@", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := request(tt.remote, tt.headers...)
			if got := id.ClientKey(r); got != tt.want {
				t.Fatalf("ClientKey = %q, want %q", got, tt.want)
			}
			ds := id.Descriptors(r)
			if tt.want == "" {
				if len(ds) != 0 {
					t.Fatalf("descriptors %+v, want none", ds)
				}
				return
			}
			want := []Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: tt.want}}, Cost: 1}}
			if !reflect.DeepEqual(ds, want) {
				t.Fatalf("descriptors %+v, want %+v", ds, want)
			}
		})
	}
}

func TestPrefixes(t *testing.T) {
	t.Parallel()
	id := mustParse(t, `
domain: api
ipv4_prefix: 24
ipv6_prefix: 48
rate_limits: [{actions: [{remote_address: {descriptor_key: net}}]}]
`)
	tests := []struct{ name, remote, want string }{
		{"ipv4 /24", "203.0.113.77:1", "203.0.113.0/24"},
		{"ipv6 /48", "[2001:db8:1:2::1]:1", "2001:db8:1::/48"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := id.Descriptors(request(tt.remote))
			if len(ds) != 1 || ds[0].Entries[0] != (rules.Entry{Key: "net", Value: tt.want}) {
				t.Fatalf("got %+v, want net=%s", ds, tt.want)
			}
		})
	}
}

const hsKey = "0123456789abcdef0123456789abcdef"

func sign(t *testing.T, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

func pemPublic(t *testing.T, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// hybrid is the per-IP and per-user scheme: two descriptors at once.
const hybrid = `
domain: api
trusted_proxies: [10.0.0.0/8]
jwt: {algorithm: HS256, key: "` + hsKey + `", issuer: sluice-test}
rate_limits:
  - actions:
      - remote_address: {}
  - actions:
      - jwt_claim: {claim: sub, descriptor_key: user, default_value: anonymous}
      - path: {prefix: /v1/}
`

func TestJWTAndHybrid(t *testing.T) {
	t.Parallel()
	id := mustParse(t, hybrid)
	valid := jwt.MapClaims{"sub": "alice", "iss": "sluice-test", "exp": t0.Add(time.Hour).Unix()}
	other := rsaKey(t)
	tests := []struct {
		name string
		auth string
		want string // the user entry
	}{
		{"valid token", sign(t, jwt.SigningMethodHS256, []byte(hsKey), valid), "alice"},
		{"no token", "", "anonymous"},
		{"not a bearer", "Basic YWxpY2U6cHc=", "anonymous"},
		{"garbage", "Bearer not.a.jwt", "anonymous"},
		{"forged: another secret", sign(t, jwt.SigningMethodHS256, []byte("another secret of 32 bytes......"), valid), "anonymous"},
		{"expired (beyond the 30 s leeway)", sign(t, jwt.SigningMethodHS256, []byte(hsKey), jwt.MapClaims{"sub": "alice", "iss": "sluice-test", "exp": t0.Add(-time.Minute).Unix()}), "anonymous"},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, []byte(hsKey), jwt.MapClaims{"sub": "alice", "iss": "sluice-test", "nbf": t0.Add(time.Minute).Unix()}), "anonymous"},
		{"wrong issuer", sign(t, jwt.SigningMethodHS256, []byte(hsKey), jwt.MapClaims{"sub": "alice", "iss": "evil"}), "anonymous"},
		{"alg none", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid), "anonymous"},
		{"another algorithm (RS256)", sign(t, jwt.SigningMethodRS256, other, valid), "anonymous"},
		{"tampered payload", tamper(sign(t, jwt.SigningMethodHS256, []byte(hsKey), valid)), "anonymous"},
		{"numeric subject", sign(t, jwt.SigningMethodHS256, []byte(hsKey), jwt.MapClaims{"sub": 12345678901, "iss": "sluice-test"}), "12345678901"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Behind a shared gateway: every user has the same IP, but
			// each is limited on its own as well.
			r := request("10.0.0.1:1", "X-Forwarded-For", "198.51.100.9")
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			want := []Descriptor{
				{Entries: []rules.Entry{{Key: "remote_address", Value: "198.51.100.9"}}, Cost: 1},
				{Entries: []rules.Entry{{Key: "user", Value: tt.want}, {Key: "path", Value: "/v1/messages"}}, Cost: 1},
			}
			if got := id.Descriptors(r); !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// tamper changes the subject in a token's payload, keeping its signature.
func tamper(auth string) string {
	parts := strings.Split(strings.TrimPrefix(auth, "Bearer "), ".")
	parts[1] = "eyJzdWIiOiJtYWxsb3J5IiwiaXNzIjoic2x1aWNlLXRlc3QifQ" // {"sub":"mallory","iss":"sluice-test"}
	return "Bearer " + strings.Join(parts, ".")
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestPublicKeyAlgorithms(t *testing.T) {
	t.Parallel()
	rk := rsaKey(t)
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ek2, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.MapClaims{"sub": "bob"}
	tests := []struct {
		name string
		alg  string
		pub  any
		auth string
		want string
	}{
		{"RS256 valid", "RS256", &rk.PublicKey, sign(t, jwt.SigningMethodRS256, rk, claims), "bob"},
		{"ES256 valid", "ES256", &ek.PublicKey, sign(t, jwt.SigningMethodES256, ek, claims), "bob"},
		{"ES256 signed by another key", "ES256", &ek.PublicKey, sign(t, jwt.SigningMethodES256, ek2, claims), ""},
		{"RS256 key, HS256 token signed with the public key (algorithm confusion)", "RS256", &rk.PublicKey,
			sign(t, jwt.SigningMethodHS256, []byte(pemPublic(t, &rk.PublicKey)), claims), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Config{
				Domain:     "api",
				JWT:        &JWTConfig{Algorithm: tt.alg, Key: pemPublic(t, tt.pub)},
				RateLimits: []RateLimit{{Actions: []Action{{JWTClaim: &JWTClaim{DescriptorKey: "user"}}}}},
			}
			id, err := New(c, fixedNow)
			if err != nil {
				t.Fatal(err)
			}
			ds := id.Descriptors(request("203.0.113.1:1", "Authorization", tt.auth))
			var got string
			if len(ds) == 1 {
				got = ds[0].Entries[0].Value
			}
			if got != tt.want {
				t.Fatalf("user = %q (descriptors %+v), want %q", got, ds, tt.want)
			}
		})
	}
}

func TestActions(t *testing.T) {
	t.Parallel()
	id := mustParse(t, `
domain: api
rate_limits:
  - actions:                               # 0: dropped without the header
      - request_headers: {header_name: X-API-Key, descriptor_key: api_key}
  - actions:                               # 1: entry skipped without the header
      - generic_key: {descriptor_value: all}
      - request_headers: {header_name: X-Tenant, descriptor_key: tenant, skip_if_absent: true}
  - actions:                               # 2: default value
      - request_headers: {header_name: X-Tenant, descriptor_key: tenant, default_value: none}
  - actions:                               # 3: exact path and method
      - path: {exact: /login}
      - method: {}
  - actions:                               # 4: regex path, named group value
      - path: {regex: "^/users/[0-9]+$", descriptor_value: user-by-id}
  - actions:                               # 5: header match
      - header_value_match: {descriptor_value: mobile, headers: [{name: User-Agent, prefix_match: "App/"}]}
  - actions:                               # 6: inverted header match, cost
      - header_value_match: {descriptor_key: anon, descriptor_value: "yes", expect_match: false, headers: [{name: Authorization}]}
    cost: 3
  - actions:                               # 7: pseudo-header
      - request_headers: {header_name: ":authority", descriptor_key: host}
`)
	e := func(kv ...string) []rules.Entry {
		var es []rules.Entry
		for i := 0; i < len(kv); i += 2 {
			es = append(es, rules.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return es
	}
	tests := []struct {
		name    string
		method  string
		target  string
		headers []string
		want    []Descriptor
	}{
		{"bare GET", "GET", "/", nil, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("anon", "yes"), Cost: 3}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"headers present", "GET", "/", []string{"X-API-Key", "k1", "X-Tenant", "acme", "Authorization", "Bearer x", "User-Agent", "App/1.2"}, []Descriptor{
			{Entries: e("api_key", "k1"), Cost: 1}, {Entries: e("generic_key", "all", "tenant", "acme"), Cost: 1}, {Entries: e("tenant", "acme"), Cost: 1}, {Entries: e("header_match", "mobile"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"empty header is absent", "GET", "/", []string{"X-API-Key", "", "Authorization", "Bearer x"}, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"exact path with method", "POST", "/login", []string{"Authorization", "Bearer x"}, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("path", "/login", "method", "POST"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"dot segments cannot dodge a path limit", "POST", "/static/..//login", []string{"Authorization", "Bearer x"}, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("path", "/login", "method", "POST"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"regex path", "GET", "/users/42", []string{"Authorization", "Bearer x"}, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("path", "user-by-id"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
		{"regex path not matching", "GET", "/users/me", []string{"Authorization", "Bearer x"}, []Descriptor{
			{Entries: e("generic_key", "all"), Cost: 1}, {Entries: e("tenant", "none"), Cost: 1}, {Entries: e("host", "api.example"), Cost: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(tt.method, "http://api.example"+tt.target, nil)
			for i := 0; i+1 < len(tt.headers); i += 2 {
				r.Header.Add(tt.headers[i], tt.headers[i+1])
			}
			if got := id.Descriptors(r); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"unknown field", "domain: api\nrate_limits:\n  - actions:\n      - remote_adress: {}\n", "test.yaml:4: field remote_adress not found"},
		{"missing domain", "rate_limits: []\n", "domain: required"},
		{"bad CIDR", "domain: api\ntrusted_proxies:\n  - 10.0.0.0/8\n  - 10.0.0/33\n", "test.yaml:4: trusted_proxies[1]: \"10.0.0/33\" is neither"},
		{"bad regex", "domain: api\nrate_limits:\n  - actions:\n      - path: {regex: \"([a-z\"}\n", "test.yaml:4: rate_limits[0].actions[0].path.regex: bad regex"},
		{"no action kind", "domain: api\nrate_limits:\n  - actions:\n      - {}\n", "test.yaml:4: rate_limits[0].actions[0]: want exactly one of"},
		{"two action kinds", "domain: api\nrate_limits:\n  - actions:\n      - {method: {}, remote_address: {}}\n", "want exactly one of remote_address"},
		{"header without name", "domain: api\nrate_limits:\n  - actions:\n      - request_headers: {descriptor_key: k}\n", "rate_limits[0].actions[0].request_headers.header_name: required"},
		{"bad jwt algorithm", "domain: api\njwt:\n  algorithm: none\n  key: x\n", "test.yaml:3: jwt.algorithm: want HS256, RS256 or ES256"},
		{"bad RS256 key", "domain: api\njwt:\n  algorithm: RS256\n  key: not a pem\n", "test.yaml:4: jwt.key: RS256 public key"},
		{"negative leeway", "domain: api\njwt:\n  algorithm: HS256\n  key: k\n  leeway: -1s\n", "test.yaml:5: jwt.leeway: want 0 (the default, 30s) to 10m0s, got -1s"},
		{"huge leeway", "domain: api\njwt: {algorithm: HS256, key: k, leeway: 1h}\n", "jwt.leeway: want 0 (the default, 30s) to 10m0s, got 1h0m0s"},
		{"leeway without a unit", "domain: api\njwt: {algorithm: HS256, key: k, leeway: 30}\n", "test.yaml:2: cannot unmarshal !!int `30` into time.Duration"},
		{"leeway not a duration", "domain: api\njwt: {algorithm: HS256, key: k, leeway: soon}\n", "test.yaml:2: cannot unmarshal"},
		{"required claim twice", "domain: api\njwt:\n  algorithm: HS256\n  key: k\n  require:\n    - exp\n    - exp\n", "test.yaml:7: jwt.require[1]: \"exp\" is listed twice"},
		{"empty required claim", "domain: api\njwt: {algorithm: HS256, key: k, require: [\"\"]}\n", "jwt.require[0]: want a claim name of 1 to 128 bytes"},
		{"bad prefix", "domain: api\nipv6_prefix: 129\n", "test.yaml:2: ipv6_prefix: must be 1 to 128"},
		{"wrong type", "domain: api\nipv6_prefix: wide\n", "test.yaml:2: cannot unmarshal"},
		{"unknown forwarded header", "domain: api\ntrusted_proxies: [127.0.0.1]\nforwarded_header: X-Client-IP\n", "test.yaml:3: forwarded_header: want X-Forwarded-For, Forwarded or X-Real-IP"},
		{"forwarded header without trusted proxies", "domain: api\nforwarded_header: Forwarded\n", "test.yaml:2: forwarded_header: set without trusted_proxies"},
		{"negative cost", "domain: api\nrate_limits:\n  - actions: [{method: {}}]\n    cost: -1\n", "test.yaml:4: rate_limits[0].cost: must not be negative"},
		{"misindented action", "domain: api\nrate_limits:\n  - actions:\n      - remote_address: {}\n     - method: {}\n", "test.yaml:5: invalid YAML: did not find expected key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("test.yaml", []byte(tt.doc))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T), want a *ConfigError", err, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	c, err := Load("testdata/hybrid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, nil); err != nil {
		t.Fatal(err)
	}
	if c.Domain != "api" || len(c.RateLimits) != 2 {
		t.Fatalf("loaded %+v", c)
	}
	if _, err := Load("testdata/missing.yaml"); err == nil {
		t.Fatal("loading a missing file succeeded")
	}
}

// FuzzClientIP feeds arbitrary peers and forwarding headers to each
// forwarded_header: the result is always either the peer or an address
// that appears in the configured header, and never one when the peer is
// not trusted.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2", "", "", uint8(0))
	f.Add("203.0.113.1:80", "1.1.1.1", "for=2.2.2.2", "3.3.3.3", uint8(1))
	f.Add("[fd00::1]:80", "", `for="[2001:db8::1]:80";proto=https, for=unknown`, "", uint8(1))
	f.Add("127.0.0.1:1", ",,,", "for=;for=\"", "[::1]:5", uint8(2))
	f.Add("@", "[::1]", "", "", uint8(0))
	headers := []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"}
	ids := make([]*Identity, len(headers))
	for i, h := range headers {
		id, err := New(Config{Domain: "d", TrustedProxies: []string{"10.0.0.0/8", "fd00::/8", "127.0.0.1"}, ForwardedHeader: h},
			nil, WithLogger(quiet))
		if err != nil {
			f.Fatal(err)
		}
		ids[i] = id
	}
	f.Fuzz(func(t *testing.T, remote, xff, fwd, realIP string, mode uint8) {
		id := ids[int(mode)%len(ids)]
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		for _, h := range [][2]string{{"X-Forwarded-For", xff}, {"Forwarded", fwd}, {"X-Real-IP", realIP}} {
			if h[1] != "" {
				r.Header.Set(h[0], h[1])
			}
		}
		got := id.ClientAddr(r)
		peer := parseHost(remote)
		_ = id.group(got)
		if !peer.IsValid() || !id.isTrusted(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: got %v", remote, got)
			}
			return
		}
		if got == peer {
			return
		}
		var hops []string
		switch id.fwdKind {
		case kindXFF:
			hops = xffHops(xff)
		case kindForwarded:
			hops = forwardedHops(fwd)
		case kindRealIP:
			hops = []string{realIP}
		}
		found := false
		for _, h := range hops {
			if h != "" && parseHost(h) == got {
				found = true
			}
		}
		if !found {
			t.Fatalf("%s: got %v, which is neither the peer nor in the header", headers[id.fwdKind], got)
		}
	})
}

// TestForwardWarnings: forwarding headers that are not believed because of
// where they came from are counted, and logged once per kind.
func TestForwardWarnings(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	c, err := Parse("test.yaml", []byte("domain: api\ntrusted_proxies: [10.0.0.0/8]\nrate_limits: [{actions: [{remote_address: {}}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := New(c, nil, WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		remote  string
		headers []string
		want    ForwardStats
	}{
		{"untrusted peer without headers", "203.0.113.1:1", nil, ForwardStats{}},
		{"trusted proxy with X-Forwarded-For", "10.0.0.1:1", []string{"X-Forwarded-For", "198.51.100.1"}, ForwardStats{}},
		{"trusted proxy without any header", "10.0.0.1:1", nil, ForwardStats{}},
		{"untrusted peer with X-Forwarded-For", "203.0.113.1:1", []string{"X-Forwarded-For", "198.51.100.1"}, ForwardStats{Untrusted: 1}},
		{"untrusted peer with Forwarded", "203.0.113.2:1", []string{"Forwarded", "for=198.51.100.1"}, ForwardStats{Untrusted: 2}},
		{"untrusted peer with X-Real-IP", "203.0.113.3:1", []string{"X-Real-IP", "198.51.100.1"}, ForwardStats{Untrusted: 3}},
		{"trusted proxy with Forwarded only", "10.0.0.1:1", []string{"Forwarded", "for=198.51.100.1"}, ForwardStats{Untrusted: 3, OtherHeader: 1}},
		{"and again", "10.0.0.2:1", []string{"X-Real-IP", "198.51.100.1"}, ForwardStats{Untrusted: 3, OtherHeader: 2}},
	}
	for _, s := range steps { // in order: the counts add up
		id.Descriptors(request(s.remote, s.headers...))
		if got := id.ForwardStats(); got != s.want {
			t.Fatalf("%s: %+v, want %+v", s.name, got, s.want)
		}
	}
	out := logs.String()
	if n := strings.Count(out, msgUntrusted); n != 1 {
		t.Fatalf("%d warnings about untrusted peers, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, msgOtherHeader); n != 1 {
		t.Fatalf("%d warnings about another header, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "peer=203.0.113.1 header=X-Forwarded-For") || !strings.Contains(out, "peer=10.0.0.1 header=Forwarded forwarded_header=X-Forwarded-For") {
		t.Fatalf("warnings do not name the peer and header:\n%s", out)
	}
}

// FuzzForwarded checks that parsing Forwarded values never panics and
// yields one hop per element.
func FuzzForwarded(f *testing.F) {
	f.Add(`for=192.0.2.60;proto=http;by=203.0.113.43`)
	f.Add(`For="[2001:db8:cafe::17]:4711", for=unknown`)
	f.Add(`;;,=,for`)
	f.Fuzz(func(t *testing.T, v string) {
		hops := forwardedHops(v)
		if len(hops) != strings.Count(v, ",")+1 {
			t.Fatalf("%d hops for %d elements", len(hops), strings.Count(v, ",")+1)
		}
		for _, h := range hops {
			_ = parseHost(h)
		}
	})
}

// FuzzBearer checks the Authorization parser and that a garbage token is
// never trusted.
func FuzzBearer(f *testing.F) {
	f.Add("Bearer abc.def.ghi")
	f.Add("bearer ")
	f.Add("Basic xyz")
	id, err := New(Config{Domain: "d", JWT: &JWTConfig{Algorithm: "HS256", Key: hsKey},
		RateLimits: []RateLimit{{Actions: []Action{{JWTClaim: &JWTClaim{DescriptorKey: "user", DefaultValue: "anon"}}}}}}, fixedNow)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, h string) {
		r := &http.Request{RemoteAddr: "203.0.113.1:1", Header: http.Header{"Authorization": {h}}}
		ds := id.Descriptors(r)
		if len(ds) != 1 || ds[0].Entries[0].Value != "anon" {
			t.Fatalf("unsigned header %q gave %+v", h, ds)
		}
	})
}

func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	if _, err := New(c, nil); err == nil {
		t.Fatal("DefaultConfig without a domain is valid")
	}
	c.Domain = "api"
	id, err := New(c, nil, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	want := []Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: "2001:db8::/64"}}, Cost: 1}}
	if got := id.Descriptors(request("[2001:db8::1]:1", "X-Forwarded-For", "1.2.3.4")); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestForwardedHeader: only the header named by forwarded_header is
// believed from a trusted proxy; a client's own copy of another one passes
// through the proxy untouched and must not choose its address.
func TestForwardedHeader(t *testing.T) {
	t.Parallel()
	const peer = "127.0.0.1:80"
	tests := []struct {
		name    string
		header  string // forwarded_header; "" for the default
		headers []string
		want    string
	}{
		{"default X-Forwarded-For is believed", "", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"default: Forwarded is not believed", "", []string{"Forwarded", "for=198.51.100.1"}, "127.0.0.1"},
		{"default: X-Real-IP is not believed", "", []string{"X-Real-IP", "198.51.100.1"}, "127.0.0.1"},
		// The attack: the proxy appends Forwarded and passes the client's
		// X-Forwarded-For through.
		{"Forwarded: the client's X-Forwarded-For is ignored", "Forwarded",
			[]string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=198.51.100.1"}, "198.51.100.1"},
		{"Forwarded: a client's own Forwarded element is left of the proxy's", "Forwarded",
			[]string{"Forwarded", "for=6.6.6.6, for=198.51.100.1"}, "198.51.100.1"},
		{"Forwarded: header name in any case", "forwarded", []string{"Forwarded", "for=198.51.100.1"}, "198.51.100.1"},
		{"Forwarded: quoted IPv6 with a port", "Forwarded", []string{"Forwarded", `for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::/64"},
		{"Forwarded: an obfuscated identifier stops at the trusted hop", "Forwarded", []string{"Forwarded", "for=_hidden"}, "127.0.0.1"},
		{"Forwarded: without it, the peer", "Forwarded", []string{"X-Forwarded-For", "6.6.6.6"}, "127.0.0.1"},
		{"X-Real-IP: believed", "X-Real-IP", []string{"X-Real-IP", "198.51.100.1", "X-Forwarded-For", "6.6.6.6"}, "198.51.100.1"},
		{"X-Real-IP: the last line, the one the proxy added", "X-Real-IP", []string{"X-Real-IP", "6.6.6.6", "X-Real-IP", "198.51.100.1"}, "198.51.100.1"},
		{"X-Real-IP: unreadable, the peer", "X-Real-IP", []string{"X-Real-IP", "somewhere"}, "127.0.0.1"},
		{"X-Real-IP: with a port", "X-Real-IP", []string{"X-Real-IP", "[2001:db8::7]:443"}, "2001:db8::/64"},
		{"X-Real-IP: without it, the peer", "X-Real-IP", []string{"X-Forwarded-For", "6.6.6.6"}, "127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := "domain: api\ntrusted_proxies: [127.0.0.1]\nrate_limits: [{actions: [{remote_address: {}}]}]\n"
			if tt.header != "" {
				doc += "forwarded_header: " + tt.header + "\n"
			}
			id := mustParse(t, doc)
			if got := id.ClientKey(request(peer, tt.headers...)); got != tt.want {
				t.Fatalf("ClientKey = %q, want %q", got, tt.want)
			}
		})
	}
}

// readRequest parses a raw request line as net/http's server does.
func readRequest(t testing.TB, method, target string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + target + " HTTP/1.1\r\nHost: api.example\r\n\r\n")))
	if err != nil {
		t.Fatalf("read %s %s: %v", method, target, err)
	}
	r.RemoteAddr = "203.0.113.1:1"
	return r
}

// TestPathSpellings: the spellings of /login that reach a login handler in
// common servers all meet a limit on exact /login; case only with
// ignore_case.
func TestPathSpellings(t *testing.T) {
	t.Parallel()
	id := mustParse(t, `
domain: api
rate_limits:
  - actions: [{path: {exact: /login, descriptor_key: exact}}]
  - actions: [{path: {exact: /Login, ignore_case: true, descriptor_key: nocase}}]
  - actions: [{path: {prefix: /API/, ignore_case: true, descriptor_key: api}}]
  - actions: [{path: {regex: "^/users/[a-z]+$", ignore_case: true, descriptor_key: user}}]
  - actions: [{path: {descriptor_key: any}}]
`)
	tests := []struct {
		target string
		exact  bool   // /login, case-sensitive
		nocase bool   // /login, ignore_case
		value  string // the "any" entry: the normalised path
	}{
		{"/login", true, true, "/login"},
		{"/Login", false, true, "/Login"},
		{"/LOGIN;jsessionid=1", false, true, "/LOGIN"},
		{"/login;jsessionid=1", true, true, "/login"},
		{"/login;", true, true, "/login"},
		{"/login%3Bx=1", true, true, "/login"},
		{"/login%20", true, true, "/login"},
		{"/login%09", true, true, "/login"},
		{"/login%00", true, true, "/login"},
		{"/login%20%20/", true, true, "/login"},
		{"/login/", true, true, "/login"},
		{"//login", true, true, "/login"},
		{"/./login", true, true, "/login"},
		{"/a/../login", true, true, "/login"},
		{"/a/..%2flogin", true, true, "/login"},
		{"/%2e%2e/login", true, true, "/login"},
		{"/%6c%6f%67%69%6e", true, true, "/login"},
		{"/a;x/../login", true, true, "/login"},
		{"/..;/login", true, true, "/login"},
		{"/static%5c..%5clogin", true, true, "/login"},
		{"/login?next=/", true, true, "/login"},
		{"/login#x", true, true, "/login"},
		{"/login#", true, true, "/login"},
		{"/login?next=/#x", true, true, "/login"},
		{"/login/#/../x", true, true, "/login"},
		{"/a#/../login", false, false, "/a"},
		{"/login%23x", false, false, "/login#x"},
		{"/login.", false, false, "/login."},
		{"/login%2520", false, false, "/login%20"},
		{"/log%20in", false, false, "/log in"},
		{"/logins", false, false, "/logins"},
		{"/%ff", false, false, "/\uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			t.Parallel()
			got := map[string]string{}
			for _, d := range id.Descriptors(readRequest(t, "POST", tt.target)) {
				got[d.Entries[0].Key] = d.Entries[0].Value
			}
			if _, ok := got["exact"]; ok != tt.exact {
				t.Errorf("exact /login matched: %v, want %v (%v)", ok, tt.exact, got)
			}
			if _, ok := got["nocase"]; ok != tt.nocase {
				t.Errorf("exact /login, ignore_case, matched: %v, want %v (%v)", ok, tt.nocase, got)
			}
			if tt.nocase && got["nocase"] != "/login" {
				t.Errorf("ignore_case value %q, want /login", got["nocase"])
			}
			if got["any"] != tt.value {
				t.Errorf("path %q, want %q", got["any"], tt.value)
			}
		})
	}
	t.Run("prefix and regex ignore case", func(t *testing.T) {
		t.Parallel()
		got := map[string]string{}
		for _, d := range id.Descriptors(readRequest(t, "GET", "/Api/Users/Bob")) {
			got[d.Entries[0].Key] = d.Entries[0].Value
		}
		if got["api"] != "/api/users/bob" || got["user"] != "" {
			t.Fatalf("got %v, want api=/api/users/bob and no user", got)
		}
		got = map[string]string{}
		for _, d := range id.Descriptors(readRequest(t, "GET", "/USERS/Bob/")) {
			got[d.Entries[0].Key] = d.Entries[0].Value
		}
		if got["user"] != "/users/bob" || got["api"] != "" {
			t.Fatalf("got %v, want user=/users/bob and no api", got)
		}
	})
}

// TestJWTRequireAndLeeway: require lists claims a token must carry, a
// token issued in the future is not believed, and leeway allows for clock
// skew on exp, nbf and iat (30 s unless set).
func TestJWTRequireAndLeeway(t *testing.T) {
	t.Parallel()
	key := []byte(hsKey)
	strict := mustParse(t, `
domain: api
jwt: {algorithm: HS256, key: "`+hsKey+`", require: [exp, sub], leeway: 10s}
rate_limits: [{actions: [{jwt_claim: {claim: sub, descriptor_key: user, default_value: anonymous}}]}]
`)
	lenient := mustParse(t, `
domain: api
jwt: {algorithm: HS256, key: "`+hsKey+`"}
rate_limits: [{actions: [{jwt_claim: {claim: tenant, descriptor_key: user, default_value: anonymous}}]}]
`)
	tests := []struct {
		name   string
		id     *Identity
		claims jwt.MapClaims
		want   string
	}{
		{"strict: exp and sub", strict, jwt.MapClaims{"sub": "alice", "tenant": "alice", "exp": t0.Add(time.Hour).Unix()}, "alice"},
		{"strict: no exp", strict, jwt.MapClaims{"sub": "alice", "tenant": "alice"}, "anonymous"},
		{"strict: exp null", strict, jwt.MapClaims{"sub": "alice", "exp": nil}, "anonymous"},
		{"strict: no sub", strict, jwt.MapClaims{"tenant": "alice", "exp": t0.Add(time.Hour).Unix()}, "anonymous"},
		{"strict: expired within the leeway", strict, jwt.MapClaims{"sub": "alice", "exp": t0.Add(-9 * time.Second).Unix()}, "alice"},
		{"strict: expired beyond the leeway", strict, jwt.MapClaims{"sub": "alice", "exp": t0.Add(-11 * time.Second).Unix()}, "anonymous"},
		{"strict: issued in the future, within the leeway", strict, jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix(), "iat": t0.Add(9 * time.Second).Unix()}, "alice"},
		{"strict: issued in the future", strict, jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix(), "iat": t0.Add(time.Hour).Unix()}, "anonymous"},
		{"strict: not before, beyond the leeway", strict, jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix(), "nbf": t0.Add(11 * time.Second).Unix()}, "anonymous"},
		{"default: no exp is accepted", lenient, jwt.MapClaims{"tenant": "acme"}, "acme"},
		{"default: issued in the future", lenient, jwt.MapClaims{"tenant": "acme", "iat": t0.Add(time.Hour).Unix()}, "anonymous"},
		{"default: issued 29 s ahead (30 s leeway)", lenient, jwt.MapClaims{"tenant": "acme", "iat": t0.Add(29 * time.Second).Unix()}, "acme"},
		{"default: expired 29 s ago (30 s leeway)", lenient, jwt.MapClaims{"tenant": "acme", "exp": t0.Add(-29 * time.Second).Unix()}, "acme"},
		{"default: expired 31 s ago", lenient, jwt.MapClaims{"tenant": "acme", "exp": t0.Add(-31 * time.Second).Unix()}, "anonymous"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ds := tt.id.Descriptors(request("203.0.113.1:1", "Authorization", sign(t, jwt.SigningMethodHS256, key, tt.claims)))
			if len(ds) != 1 || ds[0].Entries[0].Value != tt.want {
				t.Fatalf("got %+v, want user=%s", ds, tt.want)
			}
		})
	}
}

// TestCaps: an identity file above MaxFileBytes is refused before it is
// parsed, and a token above maxTokenBytes is anonymous without being
// decoded, even if it is validly signed.
func TestCaps(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	big := dir + "/big.yaml"
	if err := os.WriteFile(big, []byte("domain: api\n# "+strings.Repeat("x", MaxFileBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), big+": too large: more than 1048576 bytes") {
		t.Fatalf("Load of a file above the cap: %v", err)
	}
	if _, _, err := LintFile(big); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("LintFile of a file above the cap: %v", err)
	}
	id := mustParse(t, "domain: api\njwt: {algorithm: HS256, key: \""+hsKey+"\"}\nrate_limits: [{actions: [{jwt_claim: {descriptor_key: user, default_value: anon}}]}]\n")
	for _, tt := range []struct {
		pad  int
		want string
	}{{100, "alice"}, {maxTokenBytes, "anon"}} {
		auth := sign(t, jwt.SigningMethodHS256, []byte(hsKey), jwt.MapClaims{"sub": "alice", "pad": strings.Repeat("p", tt.pad)})
		ds := id.Descriptors(request("203.0.113.1:1", "Authorization", auth))
		if got := ds[0].Entries[0].Value; got != tt.want {
			t.Errorf("token of %d bytes: user %q, want %q", len(auth), got, tt.want)
		}
	}
}
