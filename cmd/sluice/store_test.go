package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/sluicehq/sluice/server"
)

func TestByteSizeFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want int64 // 0: refused
	}{
		{"256MiB", 256 << 20},
		{"1GiB", 1 << 30},
		{"1.5GiB", 3 << 29},
		{"300MB", 300_000_000},
		{"268435456", 256 << 20},
		{"64 MiB", 64 << 20},
		{"1PiB", 1 << 50},
		{"", 0},
		{"12xyz", 0},
		{"0", 0},
		{"-1MiB", 0},
		{"2PiB", 0},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			var b int64
			err := byteSize(&b).Set(tt.in)
			if tt.want == 0 {
				if err == nil {
					t.Fatalf("Set(%q) = %d, want an error", tt.in, b)
				}
				return
			}
			if err != nil || int64(b) != tt.want {
				t.Fatalf("Set(%q) = %d, %v; want %d", tt.in, b, err, tt.want)
			}
		})
	}
	if d := byteSize(new(server.DefaultConfig().Store.MaxMemory)); d.String() != "256 MiB" {
		t.Fatalf("--max-memory's default prints as %q", d.String())
	}
}

// TestMaxMemoryFlag checks that serve refuses a --max-memory it cannot
// read before it listens (the store's own refusals: server's
// TestNewErrors).
func TestMaxMemoryFlag(t *testing.T) {
	t.Parallel()
	args := []string{"serve", "--rules", exampleRules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--max-memory", "lots"}
	var stderr bytes.Buffer
	if err := run(context.Background(), args, env(), &stderr, &stderr); exitCode(err) != 2 {
		t.Fatalf("exit code %d (%v), want 2; stderr:\n%s", exitCode(err), err, &stderr)
	}
}

// FuzzByteSize checks that --max-memory's parser never panics, accepts
// only sizes from 1 byte to 1 PiB, and reads back what it prints within
// the rounding of its one decimal.
func FuzzByteSize(f *testing.F) {
	for _, s := range []string{"256MiB", "1GiB", "1.5 GiB", "300MB", "0", "-1", "1e3", "12xyz", "", "1PiB", "1024PiB", "999999999999999999999", "0.5B", "7 kB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b int64
		if err := byteSize(&b).Set(s); err != nil {
			return
		}
		if b < 1 || b > maxMemoryCap {
			t.Fatalf("Set(%q) = %d, outside [1, 1PiB]", s, b)
		}
		var back int64
		printed := byteSize(&b).String()
		if err := byteSize(&back).Set(printed); err != nil {
			t.Fatalf("Set(%q) = %d prints as %q, which does not parse: %v", s, b, printed, err)
		}
		if d := back - b; d > b/20+1 || -d > b/20+1 {
			t.Fatalf("Set(%q) = %d prints as %q, read back as %d", s, b, printed, back)
		}
	})
}
