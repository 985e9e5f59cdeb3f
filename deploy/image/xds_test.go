package image

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// egDomain is a rate limit domain as Envoy Gateway names it: after its
// listener, namespace/gateway/listener.
const egDomain = "default/eg/http"

// TestEnvoyGateway runs the image as Envoy Gateway runs its rate limit
// Deployment: /bin/ratelimit with the variables Envoy Gateway's controller
// sets, certificates mounted, on one Docker network with Redis and an xDS
// server built as the controller's (go-control-plane's server and snapshot
// cache, ./xdsserver) over mutual TLS. The rules of each snapshot decide,
// each is acknowledged, a push that changes a limit keeps its count (in
// Redis, under Envoy's keys), a bad one is refused and the rules stay.
func TestEnvoyGateway(t *testing.T) {
	t.Parallel()
	img, redisImg := imageSluice(t), imageRedis(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "xdsserver")
	build := exec.Command("go", "build", "-o", bin, "./xdsserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./xdsserver: %v\n%s", err, out)
	}
	writeCerts(t, dir)

	netw := newNetwork(t, "xds", false)
	cs := runAll(t,
		spec{name: "xds-redis", image: redisImg, network: netw, aliases: []string{"redis"}},
		spec{name: "xds-controller", image: redisImg, network: netw, aliases: []string{"envoy-gateway"}, publish: []int{8080},
			entrypoint: "/certs/xdsserver", mounts: []string{dir + ":/certs:ro"},
			args: []string{"-cert", "/certs/xds.crt", "-key", "/certs/xds.key", "-ca", "/certs/ca.crt"}})
	control := cs[1].url(8080)
	push := func(version string, unit string, n int) {
		t.Helper()
		body := fmt.Sprintf(`[{"name":%q,"domain":%q,"descriptors":[{"key":"user","rateLimit":{"unit":%q,"requestsPerUnit":%d}}]}]`,
			egDomain, egDomain, unit, n)
		waitFor(t, "the xDS server taking version "+version, 30*time.Second, func() (bool, string) {
			code, out, err := call("POST", control+"/snapshot?node=envoy-ratelimit&version="+version, body)
			return err == nil && code == 200, fmt.Sprint(code, out, err)
		})
	}
	answered := func(version, errPart string) {
		t.Helper()
		waitFor(t, "the answer to version "+version, 30*time.Second, func() (bool, string) {
			_, out, err := call("GET", control+"/answers", "")
			want := fmt.Sprintf(`{"error":"","version":%q}`, version)
			if errPart != "" {
				return err == nil && strings.Contains(out, errPart), out
			}
			return err == nil && strings.Contains(out, want), out
		})
	}
	push("1", "HOUR", 3)

	c := run(t, spec{
		name: "xds-ratelimit", image: img, network: netw, publish: []int{8080, 8081},
		entrypoint: "/bin/ratelimit", mounts: []string{dir + ":/certs:ro"},
		env: []string{
			"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
			"LOG_LEVEL=info", "USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW",
			"CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
			"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key",
			"GRPC_CLIENT_TLS_CACERT=/certs/ca.crt",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt",
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt",
			"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379",
			"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001",
		},
	})
	waitReady(t, c, "store", time.Minute)
	limitIs := func(n int) {
		t.Helper()
		want := fmt.Sprintf(`"requestsPerUnit":%d`, n)
		waitFor(t, "the xDS rules limiting to "+want, 30*time.Second, func() (bool, string) {
			_, body, err := call("POST", c.url(8080)+"/json", `{"domain":"`+egDomain+`","descriptors":[{"entries":[{"key":"user","value":"probe"}]}]}`)
			return err == nil && strings.Contains(body, want), fmt.Sprint(body, err)
		})
	}
	limitIs(3)
	answered("1", "")

	// The gRPC listener serves mutual TLS with the mounted certificate.
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, withCert := range []bool{true, false} {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "envoy-ratelimit"}
		if withCert {
			tc.Certificates = []tls.Certificate{client}
		}
		conn, err := grpc.NewClient(c.ports[8081], grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: egDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "bob"}}}}})
		cancel()
		conn.Close()
		switch {
		case withCert && (err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 3):
			t.Errorf("gRPC over mutual TLS: %v, %v; want bob under the limit of 3", resp, err)
		case !withCert && err == nil:
			t.Error("gRPC without a client certificate answered")
		}
	}

	// Within one hour's window: a user spends the 3 of a snapshot, then a
	// snapshot raises the limit to 7 and the user's count, Envoy's key in
	// Redis, carries over: 3 more, then 429.
	got := inOneWindow(time.Hour, func(user string) string {
		var codes []int
		hit := func() {
			code, _, err := call("POST", c.url(8080)+"/json", `{"domain":"`+egDomain+`","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`)
			if err != nil {
				t.Fatal(err)
			}
			codes = append(codes, code)
		}
		push(user+"-3", "HOUR", 3)
		limitIs(3)
		for range 4 {
			hit()
		}
		push(user+"-7", "HOUR", 7)
		limitIs(7)
		answered(user+"-7", "")
		for range 4 {
			hit()
		}
		return fmt.Sprint(codes)
	})
	if want := "[200 200 200 429 200 200 200 429]"; got != want {
		t.Errorf("4 calls under a snapshot of 3 an hour, 4 under the next of 7: %s, want %s (the count kept)", got, want)
	}
	push("bad", "UNKNOWN", 7)
	answered("bad", `unknown unit`)
	limitIs(7)
}

// writeCerts writes into dir a CA (ca.crt), the xDS server's certificate
// (xds.crt, xds.key: envoy-gateway), the rate limit Deployment's (tls.crt,
// tls.key: envoy-ratelimit, for its server and as a client, as Envoy
// Gateway's certgen makes it) and a client's of its gRPC API (client.crt,
// client.key), valid for an hour, readable by the image's user.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, block *pem.Block) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.crt", &pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for i, c := range []struct{ file, name string }{{"xds", "envoy-gateway"}, {"tls", "envoy-ratelimit"}, {"client", "envoy"}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: c.name}, DNSNames: []string{c.name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(c.file+".crt", &pem.Block{Type: "CERTIFICATE", Bytes: der})
		write(c.file+".key", &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
}
