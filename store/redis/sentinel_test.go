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
	waitFor(t, 10*time.Second, "the replica in sync", func() bool {
		return strings.Contains(replica.CLI("info", "replication"), "master_link_status:up")
	})
	sentinel := testenv.StartRedisSentinel(t, master, "mymaster")
	// The sentinel learns of the replica from the master's INFO.
	waitFor(t, 15*time.Second, "the sentinel discovering the replica", func() bool {
		return strings.Contains(sentinel.CLI("sentinel", "replicas", "mymaster"), replica.Addr[len("127.0.0.1:"):])
	})

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
	waitFor(t, 10*time.Second, "the write reaching the replica", func() bool {
		return strings.TrimSpace(replica.CLI("exists", cfg.KeyPrefix+"{sentinel}")) == "1"
	})

	master.Kill()
	killed := time.Now()
	waitFor(t, 30*time.Second, "decisions after the master died", func() bool {
		d, err = take()
		return err == nil
	})
	t.Logf("decisions continue %v after the master died", time.Since(killed).Round(time.Millisecond))
	if d.Remaining != 4 {
		t.Fatalf("after the failover: %+v, want 4 remaining (the state survived on the replica)", d)
	}
}
