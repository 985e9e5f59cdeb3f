package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestHeartbeat counts the servers that heartbeat on one Redis (and one
// Redis Cluster), each through a store of its own: a renewal counts a
// server once, a heartbeat ends after its lifetime on the store's clock,
// a lifetime of 0 removes the server, and a store of another key prefix
// counts its own servers.
func TestHeartbeat(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clocktest.New(t0)
			cfg := testConfig(clk.Now)
			url := b.url(t)
			a, c := open(t, url, cfg), open(t, url, cfg)
			other := cfg
			other.KeyPrefix += "other:"
			o := open(t, url, other)
			beat := func(s *Store, id string, ttl time.Duration, want int64) {
				t.Helper()
				n, err := s.Heartbeat(ctx, id, ttl)
				if err != nil || n != want {
					t.Fatalf("heartbeat %s %v: %d servers %v, want %d", id, ttl, n, err, want)
				}
			}
			beat(a, "a", time.Second, 1)
			beat(c, "c", 2*time.Second, 2)
			beat(a, "a", time.Second, 2) // renewed, counted once
			beat(o, "o", time.Second, 1)
			clk.Advance(1500 * time.Millisecond) // a's heartbeat ended, c's not
			beat(c, "c", 2*time.Second, 1)
			beat(a, "a", time.Second, 2) // a comes back
			beat(a, "a", 0, 1)           // a stops
			if _, err := a.Heartbeat(ctx, "", time.Second); err == nil {
				t.Fatal("a heartbeat with no ID was taken")
			}
			if _, err := a.Heartbeat(ctx, "a", 25*time.Hour); err == nil {
				t.Fatal("a heartbeat of 25 h was taken")
			}
		})
	}
}

// TestFleet checks that the fleet's set (every server using the Redis) is
// not async mode's: a server counted in one is not in the other.
func TestFleet(t *testing.T) {
	ctx := context.Background()
	clk := clocktest.New(t0)
	s := open(t, backends()[0].url(t), testConfig(clk.Now))
	if n, err := s.Fleet(ctx, "f", time.Second); err != nil || n != 1 {
		t.Fatalf("Fleet: %d, %v; want 1", n, err)
	}
	if n, err := s.Heartbeat(ctx, "a", time.Second); err != nil || n != 1 {
		t.Fatalf("Heartbeat beside a fleet of 1: %d, %v; want 1", n, err)
	}
	if n, err := s.Fleet(ctx, "g", time.Second); err != nil || n != 2 {
		t.Fatalf("Fleet: %d, %v; want 2", n, err)
	}
}
