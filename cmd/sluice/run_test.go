package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: -1}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	jwtOnly := filepath.Join(dir, "jwt-only.yaml")
	if err := os.WriteFile(jwtOnly, []byte(`domain: api
forward_auth_headers: X-Forwarded
jwt: {algorithm: HS256, key: "0123456789abcdef0123456789abcdef"}
rate_limits:
  - actions:
      - jwt_claim: {claim: sub, descriptor_key: user}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	badIdentity := filepath.Join(dir, "bad-identity.yaml")
	if err := os.WriteFile(badIdentity, []byte("domain: api\nforwarded_header: X-Client-IP\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	otherDomain := filepath.Join(dir, "other-domain.yaml")
	if err := os.WriteFile(otherDomain, []byte("domain: web\nforward_auth_headers: X-Original\nrate_limits: [{actions: [{remote_address: {}}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Envoy's runtime layout: files without extensions, one domain split
	// over two of them in a subdirectory.
	envoyDir := filepath.Join(dir, "runtime", "config")
	for name, data := range map[string]string{
		"a":        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"sub/b.v1": "domain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(envoyDir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(envoyDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	detailed := filepath.Join(dir, "detailed.yaml")
	if err := os.WriteFile(detailed, []byte("domain: api\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n"+
		"  - key: plan\n    value: gold\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const exampleIdentity = "../../examples/nginx/identity.yaml"
	tests := []struct {
		name    string
		args    []string
		env     func(string) string
		code    int // 0: success
		stdout  string
		stderrs []string // lines of stderr, as prefixes
		err     string   // in the error run returns
	}{
		{name: "example rules", args: []string{"check", exampleRules}, stdout: "ok: 1 domain(s): api"},
		{name: "rules from the environment", args: []string{"check"}, env: env("SLUICE_RULES=" + exampleRules), stdout: "ok: 1 domain(s): api"},
		{name: "broken file", args: []string{"check", broken}, code: 1, stderrs: []string{broken + ":4: ", broken + ":6: "}},
		{name: "missing file", args: []string{"check", filepath.Join(dir, "nope.yaml")}, code: 1},
		{name: "Envoy's runtime layout", args: []string{"check", "--rules-envoy-layout", "--rules-merge-domains", envoyDir}, stdout: "ok: 1 domain(s): api",
			stderrs: []string{"warning: " + filepath.Join(envoyDir, "sub", "b.v1") + ":4: requests_per_unit: 0 denies every request of api.ip"}},
		{name: "detailed_metric on a key whose values clients choose", args: []string{"check", detailed}, stdout: "ok: 1 domain(s): api",
			stderrs: []string{"warning: " + detailed + ":3: detailed_metric: metrics named by each value of remote_address a client sends: one series per value; the values seen most keep theirs"}},
		{name: "Envoy's layout, domains not merged", args: []string{"check", "--rules-envoy-layout", envoyDir}, code: 1, stderrs: []string{filepath.Join(envoyDir, "sub", "b.v1") + `:1: duplicate domain "api"`}},
		{name: "Envoy's layout not asked for", args: []string{"check", envoyDir}, code: 1, stderrs: []string{envoyDir + ": no rules"}},
		{name: "file above --max-rules-size", args: []string{"check", "--max-rules-size", "100", exampleRules}, code: 1, stderrs: []string{exampleRules + ": too large: "}},
		{name: "identity alone", args: []string{"check", "--identity", exampleIdentity}, stdout: exampleIdentity + ": ok: identity for domain api, 3 rate limit(s), 0 warning(s)"},
		{name: "identity and rules", args: []string{"check", "--identity", exampleIdentity, exampleRules}, stdout: "ok: 1 domain(s): api"},
		{name: "identity whose requests can yield no descriptor", args: []string{"check", "--identity", jwtOnly}, stdout: "2 warning(s)",
			stderrs: []string{"warning: " + jwtOnly + ":4: rate_limits: a request can yield no descriptor and pass unlimited (rate_limits[0] needs a verified token with claim sub)", "warning: " + jwtOnly + ":3: jwt.require: tokens without exp"}},
		{name: "invalid identity", args: []string{"check", "--identity", badIdentity, exampleRules}, code: 1, stderrs: []string{badIdentity + ":2: forwarded_header: want X-Forwarded-For, Forwarded or X-Real-IP"}},
		{name: "identity for a domain without rules", args: []string{"check", "--identity", otherDomain, exampleRules}, stdout: "ok: 1 domain(s): api",
			stderrs: []string{"warning: " + exampleRules + ": no rules for the identity file's domain web: every request passes"}},
		{name: "an identity file given as rules", args: []string{"check", exampleIdentity}, code: 1,
			err: "an identity file, not rules: check it with sluice check --identity " + exampleIdentity},
		{name: "no path", args: []string{"check"}, code: 2},
		{name: "two paths", args: []string{"check", "a", "b"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			getenv := tt.env
			if getenv == nil {
				getenv = env()
			}
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, getenv, &stdout, &stderr)
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d; stderr:\n%s", got, err, tt.code, &stderr)
			}
			if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("error %v, want it to contain %q", err, tt.err)
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout %q does not contain %q", &stdout, tt.stdout)
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(tt.stderrs) > 0 && len(lines) != len(tt.stderrs) {
				t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(tt.stderrs), &stderr)
			}
			for i, want := range tt.stderrs {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("stderr line %d: %q, want it to start with %q", i, lines[i], want)
				}
			}
		})
	}
}

// exitCode returns the status sluice would exit with for run's error.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	return 1
}

func TestUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
	}{
		{name: "help", args: []string{"--help"}, stdout: "SUBCOMMANDS"},
		{name: "serve help", args: []string{"serve", "-h"}, stdout: "$SLUICE_GRPC_ADDR"},
		{name: "version", args: []string{"version"}, stdout: "sluice "},
		{name: "no subcommand", args: nil, code: 2},
		{name: "unknown subcommand", args: []string{"frobnicate"}, code: 2},
		{name: "unknown flag", args: []string{"serve", "--bogus"}, code: 2},
		{name: "serve without rules", args: []string{"serve"}, code: 2},
		{name: "bad fail mode", args: []string{"serve", "--rules", exampleRules, "--fail", "sideways"}, code: 2},
		{name: "bad headers", args: []string{"serve", "--rules", exampleRules, "--response-headers", "x-foo"}, code: 2},
		{name: "bad log level", args: []string{"serve", "--rules", exampleRules, "--log-level", "loud"}, code: 2},
		{name: "bench needs a target", args: []string{"bench"}, code: 2},
		{name: "bench zipf below 1", args: []string{"bench", "--grpc-addr", "127.0.0.1:1", "--zipf", "0.5"}, code: 2},
		{name: "bad sync mode", args: []string{"serve", "--rules", exampleRules, "--sync", "later"}, code: 2},
		{name: "no lease lifetime", args: []string{"serve", "--rules", exampleRules, "--lease-lifetime", "0s"}, code: 2},
		{name: "no concurrency lease", args: []string{"serve", "--rules", exampleRules, "--concurrency-lease", "0s"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, env(), &stdout, &stderr)
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d; stderr:\n%s", got, err, tt.code, &stderr)
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout %q does not contain %q", &stdout, tt.stdout)
			}
		})
	}
}

// TestEnvironment starts serve with its rules and addresses from the
// environment, one address overridden by a flag.
func TestEnvironment(t *testing.T) {
	getenv := env(
		"SLUICE_RULES="+exampleRules,
		"SLUICE_HTTP_ADDR=256.0.0.1:1", // the flag startServer passes wins
		"SLUICE_GRPC_ADDR=127.0.0.1:0",
		"SLUICE_SHUTDOWN_TIMEOUT=3s",
	)
	s := startServer(t, getenv)
	if r := s.do(t, "GET", "/readyz", ""); r.code != 200 {
		t.Errorf("readyz %d %s, want 200", r.code, r.body)
	}
	if rec := s.logs.Find("shutting down"); rec != nil {
		t.Errorf("shut down early: %v", rec)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if rec := s.logs.Find("shutting down"); rec == nil || rec["timeout"] != float64(3*time.Second) {
		t.Errorf("shutdown logged as %v, want the timeout of $SLUICE_SHUTDOWN_TIMEOUT", rec)
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  func(string) string
		want string // the --store flag after parsing
		err  bool
	}{
		{name: "default", want: "memory", env: env()},
		{name: "environment", env: env("SLUICE_STORE=memory://env"), want: "memory://env"},
		{name: "flag over environment", args: []string{"--store", "memory://flag"}, env: env("SLUICE_STORE=memory://env"), want: "memory://flag"},
		{name: "bad value", env: env("SLUICE_STORE_TIMEOUT=soon"), want: "memory", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := serveCommand(&bytes.Buffer{})
			if err := cmd.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := applyEnv(cmd.Flags, tt.env)
			if (err != nil) != tt.err {
				t.Fatalf("applyEnv error %v, want error %v", err, tt.err)
			}
			f, _ := cmd.Flags.GetFlag("store")
			if got := f.GetValue(); got != tt.want {
				t.Errorf("--store %q, want %q", got, tt.want)
			}
		})
	}
}
