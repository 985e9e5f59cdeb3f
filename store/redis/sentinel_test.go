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
		return sluice.Take(ctx, s, "{sentinel}", l, 3)
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

// TestSentinelAuth decides through a Redis Sentinel that requires a
// password (its requirepass): with Config.SentinelPassword the store
// finds the master and decides; without it, or with a wrong one, Open
// fails. The master's own password is the URL's, apart from it.
func TestSentinelAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master and a sentinel")
	}
	t.Parallel()
	master := testenv.StartRedis(t)
	if got := master.Do("CONFIG", "SET", "requirepass", "masterpw"); got != "+OK" {
		t.Fatalf("CONFIG SET requirepass = %q", got)
	}
	// The sentinel needs the master's password to watch it; it is
	// started first and told afterwards.
	sentinel := testenv.StartRedisSentinelAuth(t, master, "authmaster", "sentinelpw")
	if got := sentinel.Do("SENTINEL", "SET", "authmaster", "auth-pass", "masterpw"); got != "+OK" {
		t.Fatalf("SENTINEL SET auth-pass = %q", got)
	}
	url := "redis+sentinel://:masterpw@" + sentinel.Addr + "/authmaster"

	for _, tt := range []struct{ name, user, pass, want string }{
		{"no password", "", "", "NOAUTH"}, {"a wrong password", "", "nope", "WRONGPASS"},
	} {
		cfg := DefaultConfig()
		cfg.SentinelUsername, cfg.SentinelPassword = tt.user, tt.pass
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := Open(ctx, url, cfg)
		cancel()
		if err == nil {
			s.Close()
			t.Fatalf("%s for the sentinel: Open succeeded, want %s", tt.name, tt.want)
		}
		if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "masterpw") {
			t.Fatalf("%s for the sentinel: Open = %v, want %s (and no password)", tt.name, err, tt.want)
		}
	}

	cfg := DefaultConfig()
	cfg.SentinelPassword = "sentinelpw"
	s := open(t, url, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := sluice.Limit{Rate: 2, Period: time.Hour}
	for i, want := range []bool{true, true, false} {
		d, err := sluice.Take(ctx, s, "{sentinel-auth}", l, 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("Take %d through the sentinel = %+v, %v; want allowed %v (2 an hour)", i+1, d, err, want)
		}
	}
	if got := strings.TrimSpace(master.CLI("-a", "masterpw", "--no-auth-warning", "exists", cfg.KeyPrefix+"{sentinel-auth}")); got != "1" {
		t.Errorf("EXISTS on the master = %q, want 1", got)
	}
}
