package main

import (
	"context"
	"crypto/tls"
	"io"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestServeEnvoyGateway runs `sluice serve` with the variables Envoy
// Gateway gives its rate limit Deployment and certificates made for the
// test: the rules come from a management server built as Envoy Gateway's
// over mutual TLS, and the gRPC listener serves mutual TLS, presenting a
// rotated certificate from the next connection on while a connection open
// across the rotation goes on answering.
func TestServeEnvoyGateway(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t, "envoy-gateway CA")
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	testenv.ReplaceFile(t, path("ca.crt"), ca.PEM)
	ca.Issue(t, true, "envoy-ratelimit").Write(t, path("client.crt"), path("client.key"))
	first := ca.Issue(t, false, "envoy-ratelimit.envoy-gateway-system.svc")
	first.Write(t, path("tls.crt"), path("tls.key"))

	const node = "envoy-ratelimit"
	x := testenv.NewXDS(t, "", grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{*ca.Issue(t, false, "envoy-gateway").Pair(t)},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()})))
	x.Push(node, "1", testenv.RateLimitConfig("default/eg/http", "user", 3, rlconf.RateLimitUnit_HOUR))

	logs := &testenv.Logs{}
	getenv := env("RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "LOG_FORMAT=json", "USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL="+x.Addr, "CONFIG_GRPC_XDS_NODE_ID="+node, "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+path("client.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+path("client.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+path("ca.crt"),
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+path("tls.crt"), "GRPC_SERVER_TLS_KEY="+path("tls.key"),
		"GRPC_CLIENT_TLS_CACERT="+path("ca.crt"),
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
		"SLUICE_STORE=memory") // no Redis here: Envoy's keys are tested elsewhere
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, getenv, io.Discard, logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v\n%s", err, logs)
		}
	}()
	var rec map[string]any
	eventually(t, "serve listens", func() bool { rec = logs.Find("listening"); return rec != nil })
	grpcAddr, _ := rec["grpc_addr"].(string)
	if warn := logs.Find("Envoy ratelimit's variables without effect in sluice"); !strings.Contains(variables(warn), "RUNTIME_ROOT") {
		t.Errorf("no warning naming RUNTIME_ROOT, unused with rules from xDS: %v", warn)
	}

	client := ca.Issue(t, true, "envoy").Pair(t)
	dial := func(cert *tls.Certificate) *grpc.ClientConn {
		t.Helper()
		tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), ServerName: "envoy-ratelimit.envoy-gateway-system.svc"}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() }) //nolint:errcheck // the test is over
		return conn
	}
	ask := func(conn *grpc.ClientConn) (*rlsv3.RateLimitResponse, *big.Int, error) {
		var p peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}},
			grpc.Peer(&p))
		if err != nil {
			return nil, nil, err
		}
		return resp, p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber, nil
	}

	conn := dial(client)
	eventually(t, "the rules from xDS deciding (Envoy Gateway's domain namespace/gateway/listener)", func() bool {
		resp, _, err := ask(conn)
		return err == nil && len(resp.GetStatuses()) == 1 && resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 3
	})
	if _, _, err := ask(dial(nil)); err == nil {
		t.Error("a call without a client certificate was answered; GRPC_CLIENT_TLS_CACERT requires one")
	}

	// Rotate the gRPC listener's certificate: the connection open goes on,
	// on the certificate it has; a new connection gets the new one.
	second := ca.Issue(t, false, "envoy-ratelimit.envoy-gateway-system.svc")
	second.Write(t, path("tls.crt"), path("tls.key"))
	if _, serial, err := ask(conn); err != nil || serial.Cmp(first.Serial) != 0 {
		t.Errorf("the connection open across the rotation: serial %v, %v; want the first %v", serial, err, first.Serial)
	}
	if _, serial, err := ask(dial(client)); err != nil || serial.Cmp(second.Serial) != 0 {
		t.Errorf("a new connection: serial %v, %v; want the rotated %v", serial, err, second.Serial)
	}

	// A new snapshot: in force, acknowledged.
	x.Push(node, "2", testenv.RateLimitConfig("default/eg/http", "user", 7, rlconf.RateLimitUnit_HOUR))
	eventually(t, "the pushed limit deciding", func() bool {
		resp, _, err := ask(conn)
		return err == nil && len(resp.GetStatuses()) == 1 && resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 7
	})
}

// variables returns the variables a log line names, comma-separated.
func variables(rec map[string]any) string {
	if l, ok := rec["variables"].([]any); ok {
		s := make([]string, len(l))
		for i, x := range l {
			s[i], _ = x.(string)
		}
		return strings.Join(s, ",")
	}
	return ""
}

// TestXDSConfigFile sets rules from xDS in a config file: lists of
// key=value (and Envoy's key:value) for the node's metadata and headers.
func TestXDSConfigFile(t *testing.T) {
	t.Parallel()
	fs := serveFlags(t)
	cfg := `rules: xds://envoy-gateway:18001
rules-xds-node: envoy-ratelimit
rules-xds-node-metadata: [cluster=eg, "zone:a"]
rules-xds-headers: x-tenant=acme
rules-xds-tls: true
rules-xds-start-without-rules: true
`
	if err := applyConfig(fs, "sluice.yaml", []byte(cfg)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"rules": "xds://envoy-gateway:18001", "rules-xds-node": "envoy-ratelimit", "rules-xds-node-metadata": "cluster=eg,zone=a",
		"rules-xds-headers": "x-tenant=acme", "rules-xds-tls": "true", "rules-xds-start-without-rules": "true",
	} {
		if got := flagValue(t, fs, name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	if err := applyConfig(serveFlags(t), "bad.yaml", []byte("rules-xds-headers: novalue\n")); err == nil || !strings.Contains(err.Error(), "bad.yaml:1") {
		t.Errorf("a header without a value: %v, want a mistake at bad.yaml:1", err)
	}
}
