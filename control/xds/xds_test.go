package xds_test

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is the node id the tests' Subscriptions send and the management
// server keeps its snapshots under, as Envoy Gateway keys them.
const node = "envoy-gateway-system/envoy-ratelimit"

// mgmt is a management server as Envoy Gateway's, serving node.
type mgmt struct {
	*testenv.XDS
	t testing.TB
}

func newMgmt(t testing.TB, addr string, opts ...grpc.ServerOption) *mgmt {
	t.Helper()
	return &mgmt{testenv.NewXDS(t, addr, opts...), t}
}

func (m *mgmt) push(version string, rcs ...*rlconf.RateLimitConfig) {
	m.t.Helper()
	m.Push(node, version, rcs...)
}

// ack waits for the node's ACK of version.
func (m *mgmt) ack(version string) *discovery.DiscoveryRequest {
	m.t.Helper()
	return m.answer("the ACK of "+version, func(r *discovery.DiscoveryRequest) bool {
		return r.GetErrorDetail() == nil && r.GetVersionInfo() == version
	})
}

// nack waits for a NACK whose detail has want.
func (m *mgmt) nack(want string) *discovery.DiscoveryRequest {
	m.t.Helper()
	return m.answer("a NACK naming "+want, func(r *discovery.DiscoveryRequest) bool {
		return strings.Contains(r.GetErrorDetail().GetMessage(), want)
	})
}

// answer waits for the node's answer to a response that ok accepts.
func (m *mgmt) answer(what string, ok func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	m.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-m.Reqs:
			if r.GetResponseNonce() != "" && ok(r) {
				return r
			}
		case <-timeout:
			m.t.Fatalf("no %s", what)
			return nil
		}
	}
}

var domain = testenv.RateLimitConfig

// updates collects what a Subscription reports.
type update struct {
	set     *rules.Set
	version string
	err     error
}

func subscribe(t testing.TB, c xds.Config) (*xds.Subscription, chan update) {
	t.Helper()
	ch := make(chan update, 256)
	c.Node = node
	c.RetryInitial = 10 * time.Millisecond
	c.RetryMax = 50 * time.Millisecond
	c.OnUpdate = func(set *rules.Set, version string, err error) { ch <- update{set, version, err} }
	c.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	s, err := xds.Subscribe(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) //nolint:errcheck // never fails
	return s, ch
}

func next(t testing.TB, ch chan update) update {
	t.Helper()
	select {
	case u := <-ch:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no update")
		return update{}
	}
}

// limitOf returns the rate of domain's descriptor key, or -1 when it has
// none.
func limitOf(set *rules.Set, domain, key string) int64 {
	r, err := set.Match(domain, []rules.Entry{{Key: key}})
	if err != nil || r == nil || len(r.Limits) == 0 {
		return -1
	}
	return r.Limits[0].Limit.Rate
}

// TestSnapshots serves the snapshots Envoy Gateway serves as its routes
// change, one after another, and checks the rules in force after each
// and what the node answered.
func TestSnapshots(t *testing.T) {
	m := newMgmt(t, "")
	m.push("1", domain("api", "user", 10, rlconf.RateLimitUnit_SECOND))
	s, ch := subscribe(t, xds.Config{Server: m.Addr, Metadata: map[string]string{"cluster": "eg"}})

	u := next(t, ch)
	if u.err != nil || u.version != "1" || limitOf(u.set, "api", "user") != 10 {
		t.Fatalf("initial rules: %+v", u)
	}
	if r := m.ack("1"); r.GetNode().GetId() != node ||
		r.GetNode().GetMetadata().GetFields()["cluster"].GetStringValue() != "eg" {
		t.Fatalf("ACK of 1: %v", r)
	}
	select {
	case <-s.Ready():
	default:
		t.Fatal("not ready after the first rules")
	}

	steps := []struct {
		name    string
		version string
		push    []*rlconf.RateLimitConfig
		want    map[string]int64 // domain/key -> rate; -1: no such limit
		refused string           // in the NACK's detail
	}{
		{"changed limit", "2", []*rlconf.RateLimitConfig{domain("api", "user", 20, rlconf.RateLimitUnit_SECOND)},
			map[string]int64{"api/user": 20}, ""},
		{"new domain", "3", []*rlconf.RateLimitConfig{domain("api", "user", 20, rlconf.RateLimitUnit_SECOND), domain("ai", "tokens", 1000, rlconf.RateLimitUnit_MINUTE)},
			map[string]int64{"api/user": 20, "ai/tokens": 1000}, ""},
		{"removed domain", "4", []*rlconf.RateLimitConfig{domain("ai", "tokens", 1000, rlconf.RateLimitUnit_MINUTE)},
			map[string]int64{"api/user": -1, "ai/tokens": 1000}, ""},
		{"unknown unit", "5", []*rlconf.RateLimitConfig{domain("ai", "tokens", 5, rlconf.RateLimitUnit_MINUTE), domain("bad", "user", 5, rlconf.RateLimitUnit_UNKNOWN)},
			map[string]int64{"ai/tokens": 1000}, `resource "bad"`},
		{"one domain twice", "6", []*rlconf.RateLimitConfig{domain("ai", "tokens", 5, rlconf.RateLimitUnit_MINUTE), {Name: "again", Domain: "ai"}},
			map[string]int64{"ai/tokens": 1000}, `resources "again" and "ai": both of domain "ai"`},
		{"good again", "7", []*rlconf.RateLimitConfig{domain("ai", "tokens", 7, rlconf.RateLimitUnit_HOUR)},
			map[string]int64{"ai/tokens": 7}, ""},
	}
	for _, st := range steps {
		m.push(st.version, st.push...)
		u := next(t, ch)
		if st.refused != "" {
			if u.err == nil || u.set != nil || !strings.Contains(u.err.Error(), st.refused) {
				t.Errorf("%s: update %+v, want refused naming %s", st.name, u, st.refused)
			}
			r := m.nack(st.refused)
			if got := s.State(); got.Refused != st.version || got.Version == st.version || r.GetVersionInfo() != got.Version {
				t.Errorf("%s: state %+v, NACK's version %q", st.name, got, r.GetVersionInfo())
			}
		} else if u.err != nil {
			t.Errorf("%s: update %+v", st.name, u)
		} else {
			m.ack(st.version)
		}
		for k, want := range st.want {
			d, key, _ := strings.Cut(k, "/")
			if got := limitOf(s.Current(), d, key); got != want {
				t.Errorf("%s: %s = %d, want %d", st.name, k, got, want)
			}
		}
	}
	if got := s.State(); got.Version != "7" || !got.Connected || !slices.Equal(got.Resources, []string{"ai"}) {
		t.Errorf("state %+v", got)
	}
}

// TestVeto refuses a response with a limit the store refuses (Check).
func TestVeto(t *testing.T) {
	m := newMgmt(t, "")
	m.push("1", domain("api", "user", 10, rlconf.RateLimitUnit_DAY))
	_, ch := subscribe(t, xds.Config{Server: m.Addr, Check: func(l sluice.Limit) error {
		if l.Period > time.Hour {
			return errors.New("too long for this store")
		}
		return nil
	}})
	if u := next(t, ch); u.err == nil || !strings.Contains(u.err.Error(), "too long") {
		t.Fatalf("update %+v, want the store's veto", u)
	}
	// The cache sends the version refused again at once; the node answers
	// each after RetryInitial (10ms here), not in a busy loop.
	first := time.Now()
	for range 3 {
		m.nack("too long")
	}
	if d := time.Since(first); d < 20*time.Millisecond {
		t.Fatalf("3 NACKs of one version in %v, want 2 waits of 10ms between them", d)
	}
}

// TestServerRestart stops the management server and starts another on
// its address: the rules stay in force meanwhile, and the node subscribes
// again, asking for the version it acknowledged.
func TestServerRestart(t *testing.T) {
	m := newMgmt(t, "")
	m.push("1", domain("api", "user", 10, rlconf.RateLimitUnit_SECOND))
	s, ch := subscribe(t, xds.Config{Server: m.Addr, Headers: map[string]string{"x-tenant": "acme"}})
	if u := next(t, ch); u.err != nil {
		t.Fatal(u.err)
	}
	m.ack("1")
	if md := <-m.MD; !slices.Equal(md.Get("x-tenant"), []string{"acme"}) {
		t.Errorf("stream metadata %v, want x-tenant: acme", md)
	}
	m.GRPC.Stop()
	waitFor(t, func() bool { return !s.State().Connected })
	if got := limitOf(s.Current(), "api", "user"); got != 10 {
		t.Fatalf("rules while the server is away: %d, want 10", got)
	}

	m2 := newMgmt(t, m.Addr)
	select {
	case r := <-m2.Reqs:
		if r.GetVersionInfo() != "1" || r.GetTypeUrl() != xds.TypeURL {
			t.Fatalf("subscription %v, want one for %s from version 1", r, xds.TypeURL)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription to the new server")
	}
	m2.push("2", domain("api", "user", 30, rlconf.RateLimitUnit_SECOND))
	if u := next(t, ch); u.err != nil || u.version != "2" || limitOf(s.Current(), "api", "user") != 30 {
		t.Fatalf("after the restart: %+v", u)
	}
}

// waitFor waits for cond, checking it every millisecond, for 10s at most.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMutualTLS subscribes over mutual TLS, with certificates made for the
// test: the server refuses a node without a client certificate, and a
// rotated client certificate is used from the next connection on.
func TestMutualTLS(t *testing.T) {
	ca := testenv.NewCA(t, "xds-ca")
	dir := t.TempDir()
	files := func(prefix string, is testenv.Issued) (string, string) {
		c, k := filepath.Join(dir, prefix+".crt"), filepath.Join(dir, prefix+".key")
		is.Write(t, c, k)
		return c, k
	}
	srvCert := ca.Issue(t, false, "localhost")
	caFile := filepath.Join(dir, "ca.crt")
	testenv.ReplaceFile(t, caFile, ca.PEM)
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*srvCert.Pair(t)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()})
	m := newMgmt(t, "", grpc.Creds(creds))
	m.push("1", domain("api", "user", 10, rlconf.RateLimitUnit_SECOND))

	cert, key := files("client", ca.Issue(t, true, "ratelimit"))
	s, ch := subscribe(t, xds.Config{Server: m.Addr, TLS: &xds.TLSFiles{Cert: cert, Key: key, CA: caFile, ServerName: "localhost"}})
	if u := next(t, ch); u.err != nil || limitOf(u.set, "api", "user") != 10 {
		t.Fatalf("over mutual TLS: %+v", u)
	}

	// Without a client certificate, no rules come.
	noCert, noCh := subscribe(t, xds.Config{Server: m.Addr, TLS: &xds.TLSFiles{CA: caFile, ServerName: "localhost"}})
	select {
	case u := <-noCh:
		t.Fatalf("rules without a client certificate: %+v", u)
	case <-time.After(200 * time.Millisecond):
	}
	if noCert.State().Connected {
		t.Fatal("connected without a client certificate")
	}

	// Rotate the client's certificate, then make the node reconnect: the
	// new one is presented.
	files("client", ca.Issue(t, true, "ratelimit-rotated"))
	m.GRPC.Stop()
	m2 := newMgmt(t, m.Addr, grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{*srvCert.Pair(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.PeerCertificates[0].DNSNames[0] != "ratelimit-rotated" {
				return errors.New("not the rotated certificate")
			}
			return nil
		}})))
	m2.push("2", domain("api", "user", 20, rlconf.RateLimitUnit_SECOND))
	if u := next(t, ch); u.err != nil || u.version != "2" || limitOf(s.Current(), "api", "user") != 20 {
		t.Fatalf("after the rotation: %+v", u)
	}
}

// TestSubscribeRefuses checks the mistakes Subscribe reports at once.
func TestSubscribeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    xds.Config
		want string
	}{
		{"no server", xds.Config{}, "Server is required"},
		{"no certificate", xds.Config{Server: "x:1", TLS: &xds.TLSFiles{Cert: "/nonexistent.crt", Key: "/nonexistent.key"}}, "client certificate"},
		{"jitter", xds.Config{Server: "x:1", RetryJitter: 2}, "RetryJitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := xds.Subscribe(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// BenchmarkPush measures the time from a snapshot's push to its rules in
// force (Current), over b.N pushes that each change a limit, and reports
// its p50 and p99.
func BenchmarkPush(b *testing.B) {
	m := newMgmt(b, "")
	m.push("0", domain("api", "user", 1, rlconf.RateLimitUnit_SECOND))
	s, ch := subscribe(b, xds.Config{Server: m.Addr})
	next(b, ch)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		start := time.Now()
		m.push(strconv.Itoa(i), domain("api", "user", uint32(i+1), rlconf.RateLimitUnit_SECOND))
		for limitOf(s.Current(), "api", "user") != int64(i+1) {
			<-ch
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// TestEnvoyGatewayNames takes rules named as Envoy Gateway names them: the
// domain after the listener (namespace/gateway/listener), descriptors after
// the route's rule and match, a distinct client by key alone.
func TestEnvoyGatewayNames(t *testing.T) {
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	rc := &rlconf.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: route, Value: route, Descriptors: []*rlconf.RateLimitDescriptor{
			{Key: "rule-0-match-0", Value: "rule-0-match-0", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}},
			{Key: "rule-0-match-1", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_SECOND, RequestsPerUnit: 10}},
		}},
	}}
	m := newMgmt(t, "")
	m.push("1", rc)
	s, ch := subscribe(t, xds.Config{Server: m.Addr})
	if u := next(t, ch); u.err != nil {
		t.Fatal(u.err)
	}
	for _, tc := range []struct {
		entries []rules.Entry
		want    int64
	}{
		{[]rules.Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}}, 3},
		{[]rules.Entry{{Key: route, Value: route}, {Key: "rule-0-match-1", Value: "10.0.0.1"}}, 10},
	} {
		r, err := s.Current().Match("default/eg/http", tc.entries)
		if err != nil || r == nil || r.Limits[0].Limit.Rate != tc.want {
			t.Errorf("Match %v = %v, %v; want a limit of %d", tc.entries, r, err, tc.want)
		}
	}
}

// TestNoRulesForNode: a server that has no rules for the node id sent
// keeps the stream open without a response; a warning says so, and the
// state says connected without a version.
func TestNoRulesForNode(t *testing.T) {
	m := newMgmt(t, "")
	m.Push("another-node", "1", domain("api", "user", 10, rlconf.RateLimitUnit_SECOND))
	logs := &testenv.Logs{}
	s, err := xds.Subscribe(xds.Config{Server: m.Addr, Node: node, WarnAfter: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() //nolint:errcheck // never fails
	waitFor(t, func() bool {
		return logs.Find("xDS stream open, and no rules for this node yet: does the server serve this node id?") != nil
	})
	if st := s.State(); !st.Connected || st.Version != "" {
		t.Errorf("state %+v, want connected without a version", st)
	}
}
