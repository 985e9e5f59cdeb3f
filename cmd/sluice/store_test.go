package main

import (
	"bytes"
	"context"
	"testing"
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
			var b byteSize
			err := b.Set(tt.in)
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
	if d := defaultMaxMemory; d.String() != "256 MiB" {
		t.Fatalf("--max-memory's default prints as %q", d.String())
	}
}

// TestMaxMemoryFlag checks that serve refuses a --max-memory it cannot
// read, or too small for the store, before it listens.
func TestMaxMemoryFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		code int
	}{
		{"not a size", []string{"--max-memory", "lots"}, 2},
		{"negative entries", []string{"--max-entries", "-5"}, 1},
		{"too small for the store", []string{"--max-memory", "1KiB"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"serve", "--rules", exampleRules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, tt.args...)
			var stderr bytes.Buffer
			err := run(context.Background(), args, env(), &stderr, &stderr)
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d; stderr:\n%s", got, err, tt.code, &stderr)
			}
		})
	}
	for _, o := range []storeOptions{{}, {maxMemory: 64 << 20}, {maxMemory: 64 << 20, maxEntries: 1000}} {
		mem, err := newMemory(o)
		if err != nil {
			t.Fatalf("newMemory(%+v): %v", o, err)
		}
		if err := mem.Close(); err != nil {
			t.Fatal(err)
		}
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
		var b byteSize
		if err := b.Set(s); err != nil {
			return
		}
		if b < 1 || b > maxMemoryCap {
			t.Fatalf("Set(%q) = %d, outside [1, 1PiB]", s, b)
		}
		var back byteSize
		if err := back.Set(b.String()); err != nil {
			t.Fatalf("Set(%q) = %d prints as %q, which does not parse: %v", s, b, b.String(), err)
		}
		if d := int64(back) - int64(b); d > int64(b)/20+1 || -d > int64(b)/20+1 {
			t.Fatalf("Set(%q) = %d prints as %q, read back as %d", s, b, b.String(), back)
		}
	})
}
