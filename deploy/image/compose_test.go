package image

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// composeFile is the Envoy quickstart's compose file.
const composeFile = "../envoy/compose.yaml"

// TestEnvoyCompose brings up the Envoy quickstart's compose file with
// docker-compose, as its first line says, minus what cannot be had here:
// Envoy's image (there is no registry to pull it from) and the images'
// builds from registries. An override file, and nothing else, puts this
// run's images in place of sluice's build and of redis:7.4-alpine (this
// machine's redis-server, unprotected as the official image is). Then
// sluice answers, on the ports the file publishes, the two descriptors
// envoy.yaml's route sends, as Envoy would ask over gRPC: five logins
// pass and the sixth is OVER_LIMIT.
//
// It binds the file's ports, 8080 and 8081, on all interfaces, holding
// the lock of the tests that use them.
func TestEnvoyCompose(t *testing.T) {
	t.Parallel()
	img, redisImg := imageSluice(t), imageRedis(t)
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		missing(t, "no docker-compose: %v", err)
	}
	lockDefaultPorts(t)
	for _, port := range []string{"8080", "8081"} {
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			missing(t, "port %s, which compose.yaml publishes, is taken: %v", port, err)
		}
		ln.Close()
	}
	t.Log("Envoy left out: its image, envoyproxy/envoy, cannot be pulled here; TestEnvoyConfig validates envoy.yaml")

	override := filepath.Join(t.TempDir(), "override.yaml")
	if err := os.WriteFile(override, []byte(`services:
  redis:
    image: `+redisImg+`
    command: ["redis-server", "--save", "", "--appendonly", "no", "--maxmemory", "192mb", "--maxmemory-policy", "noeviction", "--protected-mode", "no"]
  sluice:
    image: `+img+`
`), 0o644); err != nil {
		t.Fatal(err)
	}
	project := "sluice-test-" + runID
	dc := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := runCtx(ctx, compose, append([]string{"--project-name", project, "-f", composeFile, "-f", override}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("docker-compose logs:\n%s", dc("logs", "--no-color"))
		}
		dc("down", "--volumes", "--remove-orphans")
	})
	dc("up", "--detach", "--no-build", "redis", "sluice")

	sluice := &container{name: dc("ps", "-q", "sluice"), ports: map[int]string{8080: "127.0.0.1:8080", 8081: "127.0.0.1:8081"}}
	waitReady(t, sluice, "store", time.Minute)

	conn, err := grpc.NewClient("127.0.0.1:8081", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	entry := func(k, v string) *ratelimitcommonv3.RateLimitDescriptor_Entry {
		return &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	got := inOneWindow(time.Minute, func(user string) string {
		var codes []string
		for range 6 {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "api", // envoy.yaml's rate limit filter's domain
				Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{ // its route's two actions
					{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{entry("remote_address", "192.0.2.1")}},
					{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{entry("user", user), entry("path", "/login")}},
				},
			})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			codes = append(codes, resp.GetOverallCode().String())
		}
		return strings.Join(codes, " ")
	})
	if got != "OK OK OK OK OK OVER_LIMIT" {
		t.Errorf("six logins through the compose file's sluice: %s, want five OK and OVER_LIMIT", got)
	}
	if code, body, err := call("GET", sluice.url(8080)+"/metrics", ""); err != nil || code != 200 || !strings.Contains(body, "sluice_decisions_total") {
		t.Errorf("/metrics = %d %v", code, err)
	}
}
