package testenv

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// NginxBinary returns the path of Debian's nginx, found on PATH or in
// /usr/sbin. When there is none it fails the test under CI=true (the test
// command installs nginx, so a missing one is a broken environment) and
// skips it otherwise.
func NginxBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr == nil {
			p, err = "/usr/sbin/nginx", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("nginx not found (scripts/test.sh installs it): %v", err)
		}
		t.Skipf("nginx not found; install it (apt-get install nginx) or run scripts/test.sh: %v", err)
	}
	return p
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no earlier call in this process returned, in 23000-29999: below
// Linux's ephemeral range (32768-60999), so that a server binding port 0
// (httptest, an outgoing connection) cannot take it before the server it is
// meant for binds it, and clear of the Redis ports (20000-22767) and their
// cluster bus ports (30000-32767). Two tests that start nginx and Caddy side
// by side once got the same port from the kernel's port 0, and the second
// server's test talked to the first server.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		port := 23000 + rand.IntN(7000)
		portsMu.Lock()
		taken := portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if taken {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatal("free port: none of 1,000 tried in 23000-29999 was free")
	return 0
}

// portsGiven holds the ports FreePort has returned in this process.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Nginx starts a real nginx with the configuration conf (a whole
// nginx.conf: events and http blocks; no daemon, pid or error_log
// directives, which Nginx sets) and waits until it accepts connections on
// 127.0.0.1:port. It runs in the foreground in one process, writes its pid
// and error log to a temporary directory, and is stopped when the test
// ends; the error log is shown if the test failed.
func Nginx(t testing.TB, conf string, port int) {
	t.Helper()
	bin := NginxBinary(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatalf("write nginx config: %v", err)
	}
	errLog := filepath.Join(dir, "error.log")
	global := "daemon off; master_process off; pid " + filepath.Join(dir, "nginx.pid") + "; error_log " + errLog + " info;"
	cmd := exec.Command(bin, "-e", errLog, "-p", dir, "-c", path, "-g", global)
	// nginx stops at once on SIGINT.
	server(t, "nginx", cmd, port, 10*time.Second, func() string {
		logged, _ := os.ReadFile(errLog)
		return "nginx error log:\n" + string(logged)
	})
}

// Replace returns s with each old string of pairs replaced by the new one
// that follows it, failing the test when an old string is not in s: a
// guard that an example configuration still has the addresses a test
// rewrites.
func Replace(t testing.TB, s string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("configuration has no %q to replace", pairs[i])
		}
		s = strings.ReplaceAll(s, pairs[i], pairs[i+1])
	}
	return s
}

// syncBuffer is a bytes.Buffer safe for the writes of a process's output
// and a concurrent read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
