package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// CaddyVersion is the Caddy that scripts/test.sh builds from the Go module
// proxy when none is installed.
const CaddyVersion = "v2.11.9"

// CaddyBinary returns the path of a caddy binary, found on PATH or in
// $(go env GOPATH)/bin. When there is none it fails the test under CI=true
// (the test command builds it, so a missing one is a broken environment)
// and skips it otherwise.
func CaddyBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("caddy")
	if err != nil {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			if home, herr := os.UserHomeDir(); herr == nil {
				gopath = filepath.Join(home, "go")
			}
		}
		if c := filepath.Join(gopath, "bin", "caddy"); gopath != "" {
			if _, serr := os.Stat(c); serr == nil {
				p, err = c, nil
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("caddy not found (scripts/test.sh builds it): %v", err)
		}
		t.Skipf("caddy not found; build it (GOFLAGS= go install github.com/caddyserver/caddy/v2/cmd/caddy@%s) or run scripts/test.sh: %v", CaddyVersion, err)
	}
	return p
}

// Caddy starts a real Caddy with the Caddyfile conf and waits until it
// accepts connections on 127.0.0.1:port. Its data and configuration
// directories are temporary; it is stopped when the test ends, and its
// output is shown if the test failed.
func Caddy(t testing.TB, conf string, port int) {
	t.Helper()
	bin := CaddyBinary(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatalf("write Caddyfile: %v", err)
	}
	cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	server(t, "caddy", cmd, port, 20*time.Second, nil)
}
