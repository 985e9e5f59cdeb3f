package envoy

import (
	"github.com/sluicehq/sluice/deploy/internal/redisconf"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeService is what the defaults tests read of a compose service.
type composeService struct {
	Image    string   `yaml:"image"`
	Command  []string `yaml:"command"`
	Ports    []string `yaml:"ports"`
	MemLimit string   `yaml:"mem_limit"`
}

// composeFiles returns every compose file under deploy/ (this one and any
// added later), each with its services, so that the shipped defaults hold
// for all of them.
func composeFiles(t *testing.T) map[string]map[string]composeService {
	t.Helper()
	files := map[string]map[string]composeService{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ok, _ := filepath.Match("*compose*.y*ml", d.Name()); !ok {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var c struct {
			Services map[string]composeService `yaml:"services"`
		}
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Errorf("%s: %v", path, err)
		}
		files[path] = c.Services
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no compose file under deploy/")
	}
	return files
}

// TestComposeLoopbackOnly checks that every port a compose file publishes
// is bound to the host's loopback (127.0.0.1:HOST:CONTAINER): "8080:8080"
// would publish it on every interface of the host.
func TestComposeLoopbackOnly(t *testing.T) {
	t.Parallel()
	for path, services := range composeFiles(t) {
		for name, s := range services {
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") || strings.Count(p, ":") != 2 {
					t.Errorf("%s: service %s publishes %q, want 127.0.0.1:HOST:CONTAINER", path, name, p)
				}
			}
		}
	}
}

// adminPorts are ports that must never be published: Envoy's admin (9901:
// /quitquitquit, runtime changes, config dumps) and sluice's dashboard and
// admin API (8083 in the image: clients' keys and the rules).
var adminPorts = map[string]string{"9901": "Envoy's admin", "8083": "sluice's dashboard and admin API"}

// TestComposeNoAdminPorts checks that no compose file publishes an admin
// port, on any host address.
func TestComposeNoAdminPorts(t *testing.T) {
	t.Parallel()
	for path, services := range composeFiles(t) {
		for name, s := range services {
			for _, p := range s.Ports {
				parts := strings.Split(p, ":")
				container, _, _ := strings.Cut(parts[len(parts)-1], "/")
				if what, ok := adminPorts[container]; ok {
					t.Errorf("%s: service %s publishes %s (%s)", path, name, p, what)
				}
			}
		}
	}
}

// TestComposeRedisNoEviction checks that every Redis of a compose file
// runs under noeviction, so that memory pressure refuses writes (sluice
// decides by its fail mode and counts sluice_store_errors_total{reason=
// "oom"}) instead of evicting a client's count, with a maxmemory that
// leaves a quarter of the container's memory limit to Redis's own
// overhead (buffers, fragmentation).
func TestComposeRedisNoEviction(t *testing.T) {
	t.Parallel()
	n := 0
	for path, services := range composeFiles(t) {
		for name, s := range services {
			if !strings.HasPrefix(s.Image, "redis:") {
				continue
			}
			n++
			args := map[string]string{}
			for i := 0; i+1 < len(s.Command); i++ {
				if strings.HasPrefix(s.Command[i], "--") {
					args[s.Command[i]] = s.Command[i+1]
				}
			}
			if p := args["--maxmemory-policy"]; p != "noeviction" {
				t.Errorf("%s: %s: --maxmemory-policy %q, want noeviction: Redis would evict counts", path, name, p)
			}
			maxmem, err := redisconf.Bytes(args["--maxmemory"])
			if err != nil || maxmem <= 0 {
				t.Errorf("%s: %s: --maxmemory %q: want a size (%v)", path, name, args["--maxmemory"], err)
				continue
			}
			limit, err := dockerBytes(s.MemLimit)
			if err != nil {
				t.Errorf("%s: %s: mem_limit %q: want a size (%v)", path, name, s.MemLimit, err)
				continue
			}
			if 4*maxmem > 3*limit {
				t.Errorf("%s: %s: --maxmemory %d bytes is more than three quarters of mem_limit (%d bytes)", path, name, maxmem, limit)
			}
		}
	}
	if n == 0 {
		t.Fatal("no Redis service in the compose files")
	}
}

// versionTag is an image reference with a version tag: name:vX.Y[.Z][-...].
var versionTag = regexp.MustCompile(`^[a-z0-9./_-]+:v?[0-9]+\.[0-9]+([.-][0-9A-Za-z.-]+)?$`)

// TestComposeImageTags checks that every image is named with a version
// tag, never latest or none, so that what runs is what the file says.
func TestComposeImageTags(t *testing.T) {
	t.Parallel()
	for path, services := range composeFiles(t) {
		for name, s := range services {
			if !versionTag.MatchString(s.Image) {
				t.Errorf("%s: service %s runs image %q, want a version tag", path, name, s.Image)
			}
		}
	}
}

// dockerBytes parses a size as Docker reads mem_limit: b, k, m, g in
// powers of 1024.
func dockerBytes(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSuffix(strings.ToLower(s), "b"))
	mult := int64(1)
	for suffix, m := range map[string]int64{"k": 1 << 10, "m": 1 << 20, "g": 1 << 30} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = n, m
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}
