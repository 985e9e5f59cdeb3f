package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestSentinel decides through a Redis Sentinel, then kills the master:
// once Sentinel has promoted the replica, decisions succeed again, and
// the state written before the failover is still there.
func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a sentinel")
	}
	master := testenv.StartRedis(t, "--repl-diskless-sync-delay", "0")
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(replica.CLI("info", "replication"), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatal("replica not in sync after 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	sentinel := testenv.StartRedisSentinel(t, master, "mymaster")
	// The sentinel learns of the replica from the master's INFO.
	deadline = time.Now().Add(15 * time.Second)
	for !strings.Contains(sentinel.CLI("sentinel", "replicas", "mymaster"), replica.Addr[len("127.0.0.1:"):]) {
		if time.Now().After(deadline) {
			t.Fatal("sentinel did not discover the replica in 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}

	cfg := DefaultConfig()
	s := open(t, "redis+sentinel://"+sentinel.Addr+"/mymaster", cfg)
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	take := func() (sluice.Decision, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return s.Take(ctx, "{sentinel}", l, 3)
	}
	d, err := take()
	if err != nil || d.Remaining != 7 {
		t.Fatalf("Take through sentinel = %+v, %v; want 7 remaining", d, err)
	}
	// Let the write reach the replica before the master dies (WAIT would
	// only wait for the writes of its own connection).
	deadline = time.Now().Add(10 * time.Second)
	for strings.TrimSpace(replica.CLI("exists", cfg.KeyPrefix+"{sentinel}")) != "1" {
		if time.Now().After(deadline) {
			t.Fatal("the write did not reach the replica in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	master.Kill()
	killed := time.Now()
	deadline = time.Now().Add(30 * time.Second)
	for {
		d, err = take()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions still fail 30s after the master died: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("decisions continue %v after the master died", time.Since(killed).Round(time.Millisecond))
	if d.Remaining != 4 {
		t.Fatalf("after the failover: %+v, want 4 remaining (the state survived on the replica)", d)
	}
}
