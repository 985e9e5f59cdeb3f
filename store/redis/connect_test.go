package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestNew makes a store of a Redis that is down: decisions fail at once
// with ErrConnecting until Redis starts, then are Redis's.
func TestNew(t *testing.T) {
	r := testenv.StartRedis(t)
	r.Kill()
	var failures atomic.Int64
	start := time.Now()
	cfg := testConfig(nil)
	cfg.Retry, cfg.ConnectFailed = 50*time.Millisecond, func(error) { failures.Add(1) }
	b, err := New("redis://"+r.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("New took %v on a Redis that is down", d)
	}
	l := sluice.Limit{Rate: 2, Period: time.Hour}
	ctx := context.Background()
	if _, err := sluice.Take(ctx, b, "k", l, 1); !errors.Is(err, ErrConnecting) {
		t.Fatalf("Take before Redis is up: %v, want ErrConnecting", err)
	}
	ds := make([]sluice.Decision, 1)
	if err := b.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}, ds); !errors.Is(err, ErrConnecting) {
		t.Fatalf("TakeAll before Redis is up: %v, want ErrConnecting", err)
	}
	if b.Ready() || b.Client() != nil || failures.Load() == 0 {
		t.Fatalf("ready %v after %d failures", b.Ready(), failures.Load())
	}
	if err := b.Ping(ctx); !errors.Is(err, ErrConnecting) {
		t.Fatalf("Ping before Redis is up: %v, want ErrConnecting", err)
	}
	r.Restart()
	waitFor(t, 10*time.Second, "connected after Redis started", b.Ready)
	if err := b.Ping(ctx); err != nil {
		t.Fatalf("Ping on Redis: %v", err)
	}
	for i, want := range []bool{true, true, false} {
		d, err := sluice.Take(ctx, b, "k", l, 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("take %d on Redis: %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
	r.Kill()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Ping(pctx); err == nil {
		t.Error("Ping of a killed Redis: no error")
	}
}

// TestNewErrors checks that what no retry can fix is an error at once,
// and that Close stops the attempts.
func TestNewErrors(t *testing.T) {
	t.Parallel()
	if _, err := New("redis+nope://127.0.0.1:1", DefaultConfig()); err == nil {
		t.Error("a bad URL was accepted")
	}
	cfg := DefaultConfig()
	cfg.MaxBatch = -1
	if _, err := New("redis://127.0.0.1:1", cfg); err == nil {
		t.Error("a bad config was accepted")
	}
	cfg = DefaultConfig()
	cfg.Retry = 10 * time.Millisecond
	b, err := New("redis://127.0.0.1:1", cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting after 5s")
	}
	if _, err := sluice.Take(context.Background(), b, "k", sluice.Limit{Rate: 1, Period: time.Second}, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Take after Close: %v, want ErrClosed", err)
	}
}
