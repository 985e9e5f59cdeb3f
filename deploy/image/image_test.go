// Package image holds what makes the sluice image (rootfs.sh, which lays
// out its files, build.sh, which builds it with nothing pulled, and
// sluice.yaml, its settings) and the tests that build it and run it as
// containers on the machine's Docker Engine: as its own command, as Envoy
// ratelimit's Deployment runs it, three of them on one Redis (a node cut
// off, a rolling restart), and the Envoy quickstart's compose file.
//
// The tests fail under CI=true when the engine is missing, and skip
// otherwise. The image is built once per run.
package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// loginJSON is a request for user on /login in the example rules'
// domain, whose limit is 5 a minute.
func loginJSON(user string) string {
	return `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + user +
		`"},{"key":"path","value":"/login"}]}]}`
}

// inOneWindow returns f(user) for a user whose calls all fell within one
// window of the clock's (a minute, or an hour): a window's start during
// the first run, which would let a call more through, makes a second run
// with another user.
func inOneWindow(window time.Duration, f func(user string) string) string {
	var got string
	for _, user := range []string{"alice", "bob"} {
		start := time.Now().Truncate(window)
		got = f(user)
		if time.Now().Truncate(window).Equal(start) {
			break
		}
	}
	return got
}

// TestImageCommand runs the image as it is, with no argument: it listens
// on all interfaces as its unprivileged user, becomes ready, and the
// example rules' login limit answers the sixth login of a minute with 429.
func TestImageCommand(t *testing.T) {
	t.Parallel()
	img := imageSluice(t)
	c := run(t, spec{name: "command", image: img, publish: []int{8080, 8081}})
	waitReady(t, c, "store", 30*time.Second)

	if user := c.inspect(t, "{{.Config.User}}"); user != "65532:65532" {
		t.Errorf("the container runs as %q, want 65532:65532", user)
	}
	// The process itself, seen from the host: its real and effective ids.
	pid := c.inspect(t, "{{.State.Pid}}")
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") && (f[1] != "65532" || f[2] != "65532") {
			t.Errorf("the sluice process has %s, want 65532", line)
		}
	}

	codes := inOneWindow(time.Minute, func(user string) string {
		var codes []int
		for range 6 {
			code, body, err := call("POST", c.url(8080)+"/json", loginJSON(user))
			if err != nil {
				t.Fatal(err)
			}
			if code != 200 && code != 429 {
				t.Fatalf("/json = %d %s", code, body)
			}
			codes = append(codes, code)
		}
		return fmt.Sprint(codes)
	})
	if codes != "[200 200 200 200 200 429]" {
		t.Errorf("six logins: %v, want five 200s and a 429", codes)
	}
	if code, body, err := call("GET", c.url(8080)+"/healthcheck", ""); err != nil || code != 200 {
		t.Errorf("/healthcheck = %d %q %v", code, body, err)
	}
}

// TestImageContents lists the image's files (docker export of a
// container made from it) and checks them against what a user runs: the
// static binary, /bin/ratelimit, Debian's CA bundle, the user in
// /etc/passwd, a world-writable /tmp, the settings and the example rules,
// all in one layer; it logs the image's size, and fails past a bound that
// a static binary and a CA bundle stay well under.
func TestImageContents(t *testing.T) {
	t.Parallel()
	img := imageSluice(t)
	size, err := strconv.ParseInt(docker(t, "image", "inspect", "--format", "{{.Size}}", img), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	layers := docker(t, "image", "inspect", "--format", "{{len .RootFS.Layers}}", img)
	t.Logf("%s: %.1f MB (%d bytes) in %s layer(s)", img, float64(size)/1e6, size, layers)
	if size > 60e6 {
		t.Errorf("the image is %d bytes, want under 60 MB", size)
	}
	if layers != "1" {
		t.Errorf("the image has %s layers, want 1 (rootfs.sh lays out every file)", layers)
	}

	id := docker(t, "create", "--label", runLabel+"="+runID, img)
	defer docker(t, "rm", id)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	export := exec.CommandContext(ctx, "docker", "export", id)
	out, err := export.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := export.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	passwd := ""
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(h.Name, "/")
		files[name] = h
		if name == "/etc/passwd" {
			b, _ := io.ReadAll(tr)
			passwd = string(b)
		}
	}
	if err := export.Wait(); err != nil {
		t.Fatal(err)
	}
	want := map[string]func(h *tar.Header) bool{
		"/sluice":                            func(h *tar.Header) bool { return h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 },
		"/bin/ratelimit":                     func(h *tar.Header) bool { return h.Typeflag == tar.TypeSymlink && h.Linkname == "/sluice" },
		"/etc/passwd":                        func(h *tar.Header) bool { return strings.Contains(passwd, "sluice:x:65532:65532:") },
		"/etc/group":                         func(h *tar.Header) bool { return h.Typeflag == tar.TypeReg },
		"/tmp":                               func(h *tar.Header) bool { return h.Typeflag == tar.TypeDir && h.Mode&0o1777 == 0o1777 },
		"/etc/sluice/sluice.yaml":            func(h *tar.Header) bool { return h.Mode&0o444 == 0o444 },
		"/etc/sluice/rules/rules.yaml":       func(h *tar.Header) bool { return h.Mode&0o444 == 0o444 },
		"/etc/ssl/certs/ca-certificates.crt": func(h *tar.Header) bool { return h.Size > 100_000 && h.Mode&0o444 == 0o444 },
	}
	for name, ok := range want {
		if h := files[name]; h == nil || !ok(h) {
			t.Errorf("the image's %s: %+v, not as it should be", name, h)
		}
	}
	if env := docker(t, "image", "inspect", "--format", "{{json .Config.Env}}", img); !strings.Contains(env, `"SLUICE_CONFIG=/etc/sluice/sluice.yaml"`) {
		t.Errorf("the image's environment is %s, want SLUICE_CONFIG=/etc/sluice/sluice.yaml", env)
	}
}

// TestEnvoyDeployment runs the image as a Deployment of Envoy's ratelimit
// runs it: the command /bin/ratelimit without arguments, only Envoy's
// variables, Redis at REDIS_URL, and the runtime directory a volume whose
// current symlink is swapped to publish new rules; the swap is picked up
// without a restart.
func TestEnvoyDeployment(t *testing.T) {
	t.Parallel()
	img := imageSluice(t)
	redisImg := imageRedis(t)
	netw := newNetwork(t, "envoy", false)
	run(t, spec{name: "envoy-redis", image: redisImg, network: netw, aliases: []string{"redis"}})

	// Envoy's runtime layout: RUNTIME_ROOT is a symlink to the version
	// in force, holding RUNTIME_SUBDIRECTORY/config/*.yaml.
	rt := t.TempDir()
	if err := os.Chmod(rt, 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules := func(version string, perHour int) {
		dir := filepath.Join(rt, version, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		rules := fmt.Sprintf("domain: envoy\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", perHour)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(version string) { // a new symlink renamed over the old: atomic
		tmp := filepath.Join(rt, "current.new")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(rt, "current")); err != nil {
			t.Fatal(err)
		}
	}
	writeRules("v1", 5)
	swap("v1")

	c := run(t, spec{
		name: "envoy", image: img, network: netw, publish: []int{8080, 8081},
		entrypoint: "/bin/ratelimit",
		env: []string{
			"RUNTIME_ROOT=/srv/runtime_data/current", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "USE_STATSD=false", "LOG_LEVEL=debug",
		},
		mounts: []string{rt + ":/srv/runtime_data:ro"},
	})
	waitReady(t, c, "store", 30*time.Second)
	if code, body, err := call("GET", c.url(8080)+"/healthcheck", ""); err != nil || code != 200 || strings.TrimSpace(body) != "OK" {
		t.Errorf("/healthcheck = %d %q %v, want 200 OK", code, body, err)
	}

	// decide returns the limit that /json reports for user u, and the
	// status code.
	decide := func(u string) (int, string) {
		code, body, err := call("POST", c.url(8080)+"/json", `{"domain":"envoy","descriptors":[{"entries":[{"key":"user","value":"`+u+`"}]}]}`)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	// inForce waits until the rules in force limit each user to n.
	inForce := func(n int) {
		want := fmt.Sprintf(`"requestsPerUnit":%d`, n)
		waitFor(t, "the rules limiting to "+want, 20*time.Second, func() (bool, string) {
			_, body := decide("probe")
			return strings.Contains(body, want), body
		})
	}
	// Within one hour's window (the limits count in windows aligned to
	// the hour): user spends all of v1's 5, and user-2 finds the limit;
	// then v2 raises it to 7, and user's count, in Redis, carries over (a
	// limit's rate is not part of its ID): two more, then 429.
	got := inOneWindow(time.Hour, func(user string) string {
		writeRules(user+"-v1", 5)
		swap(user + "-v1")
		inForce(5)
		var codes []int
		for range 5 {
			code, _ := decide(user)
			codes = append(codes, code)
		}
		for range 6 {
			code, _ := decide(user + "-2")
			codes = append(codes, code)
		}
		writeRules(user+"-v2", 7)
		swap(user + "-v2")
		inForce(7)
		for range 3 {
			code, _ := decide(user)
			codes = append(codes, code)
		}
		return fmt.Sprint(codes)
	})
	if want := "[200 200 200 200 200 200 200 200 200 200 429 200 200 429]"; got != want {
		t.Errorf("5 calls of one user and 6 of another under v1 (5 an hour), 3 of the first under v2 (7): %s, want %s", got, want)
	}
}
