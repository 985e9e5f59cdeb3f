package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// inexactRules has, at line 6, a limit the Redis store cannot compute
// exactly and the memory store can.
const inexactRules = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: report
    rate_limit: {unit: day, requests_per_unit: 1000003, algorithm: token_bucket}
`

// inexactMsg is how the refusal of that limit starts.
const inexactMsg = ":6: limit 1000003/24h0m0s token_bucket: "

// TestCheckStore checks that `sluice check --store` refuses, at file:line,
// the limits that store cannot apply, without contacting it, and that the
// memory store (the default) accepts them.
func TestCheckStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "inexact.yaml")
	writeFile(t, path, inexactRules)
	tests := []struct {
		name string
		args []string
		env  func(string) string
		code int
	}{
		{"memory", []string{"check", path}, env(), 0},
		{"redis, not contacted", []string{"check", "--store", "redis://127.0.0.1:1", path}, env(), 1},
		{"redis cluster", []string{"check", "--store", "redis+cluster://127.0.0.1:1,127.0.0.1:2", path}, env(), 1},
		{"redis from the environment", []string{"check", path}, env("SLUICE_STORE=redis://127.0.0.1:1"), 1},
		{"unknown store", []string{"check", "--store", "etcd://x", path}, env(), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, tt.env, &stdout, &stderr)
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d; stderr:\n%s", got, err, tt.code, &stderr)
			}
			if tt.code == 1 && !strings.HasPrefix(stderr.String(), path+inexactMsg) {
				t.Errorf("stderr %q, want %q first", &stderr, path+inexactMsg)
			}
		})
	}
}
