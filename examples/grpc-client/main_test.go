package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/envoyrls"
)

// startSluice serves the example rules over Envoy's gRPC API on a loopback
// port, with the memory store, and returns its address.
func startSluice(t *testing.T) string {
	t.Helper()
	set, err := rules.Load("../rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := decide.DefaultConfig()
	cfg.Rules = func() *rules.Set { return set }
	cfg.Store = store
	svc, err := decide.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(envoyrls.ServerOptions()...)
	envoyrls.New(svc, envoyrls.DefaultConfig()).Register(g)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	t.Cleanup(func() {
		g.GracefulStop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		store.Close()
	})
	return ln.Addr().String()
}

func TestClient(t *testing.T) {
	addr := startSluice(t)
	tests := []struct {
		name     string
		args     []string
		err      error // errOverLimit, or nil
		errText  string
		contains []string
	}{
		{
			name:     "first 5 logins pass",
			args:     []string{"-addr", addr, "-d", "user=alice,path=/login", "-hits", "5"},
			contains: []string{`"overallCode": "OK"`, `"name": "login"`, `"unit": "MINUTE"`, `"key": "RateLimit-Policy"`},
		},
		{
			name:     "the sixth is over the limit",
			args:     []string{"-addr", addr, "-d", "user=alice,path=/login"},
			err:      errOverLimit,
			contains: []string{`"overallCode": "OVER_LIMIT"`, `"key": "Retry-After"`},
		},
		{
			name:     "two descriptors",
			args:     []string{"-addr", addr, "-d", "remote_address=192.0.2.1", "-d", "user=bob"},
			contains: []string{`"name": "per-ip"`, `"name": "per-user"`},
		},
		{name: "no descriptor", args: []string{"-addr", addr}, errText: "at least one descriptor"},
		{name: "bad descriptor", args: []string{"-addr", addr, "-d", "user"}, errText: "want key=value"},
		{name: "invalid request", args: []string{"-addr", addr, "-domain", "", "-d", "user=a"}, errText: "InvalidArgument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out)
			switch {
			case tt.errText != "":
				if err == nil || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("error %v, want one containing %q", err, tt.errText)
				}
			case !errors.Is(err, tt.err) || (tt.err == nil && err != nil):
				t.Fatalf("error %v, want %v", err, tt.err)
			}
			for _, c := range tt.contains {
				if !strings.Contains(out.String(), c) {
					t.Errorf("output does not contain %s:\n%s", c, &out)
				}
			}
		})
	}
}
