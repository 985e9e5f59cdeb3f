package testenv

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRedisServerKillRestart(t *testing.T) {
	r := StartRedis(t)
	if got := r.Do("SET", "k", "v"); got != "+OK" {
		t.Fatalf("SET = %q, want +OK", got)
	}
	r.Kill()
	if _, err := r.do(time.Second, "PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
	// No other process can take the port before Restart, and a client is
	// refused, as by a dead server.
	if l, err := net.Listen("tcp", r.Addr); err == nil {
		l.Close()
		t.Fatal("a killed server's port could be taken before Restart")
	}
	if c, err := net.Dial("tcp", r.Addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial to a killed server: %v, want connection refused", err)
	}
	r.Kill() // twice is harmless
	r.Restart()
	if got := r.Do("PING"); got != "+PONG" {
		t.Fatalf("PING after Restart = %q", got)
	}
	if got := r.Do("EXISTS", "k"); got != ":0" {
		t.Fatalf("EXISTS k after a restart without persistence = %q, want :0", got)
	}
}

func TestRedisServerPause(t *testing.T) {
	r := StartRedis(t)
	r.Pause()
	start := time.Now()
	if _, err := r.do(200*time.Millisecond, "PING"); err == nil {
		t.Fatal("a paused server answered")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("PING to a paused server took %v", d)
	}
	r.Resume()
	if got := r.Do("PING"); got != "+PONG" {
		t.Fatalf("PING after Resume = %q", got)
	}
}

func TestRedisClusterMasters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six servers")
	}
	c := StartRedisCluster(t, 3, 1)
	seen := map[string]bool{}
	for _, slot := range []int{0, 8000, 16383} {
		m := c.MasterOf(slot)
		if m == nil {
			t.Fatalf("no master for slot %d", slot)
		}
		seen[m.Addr] = true
	}
	if len(seen) != 3 {
		t.Fatalf("slots 0, 8000, 16383 on %d masters, want 3", len(seen))
	}
	if out := c.Nodes[0].CLI("cluster", "info"); !strings.Contains(out, "cluster_size:3") {
		t.Fatalf("cluster info:\n%s", out)
	}
}

func TestSharedServersFromEnv(t *testing.T) {
	t.Setenv(RedisAddrEnv, "127.0.0.1:1")
	t.Setenv(RedisClusterAddrsEnv, "127.0.0.1:1,127.0.0.1:2")
	if got := RedisAddr(t); got != "127.0.0.1:1" {
		t.Fatalf("RedisAddr = %q", got)
	}
	if got := RedisClusterAddrs(t); len(got) != 2 || got[1] != "127.0.0.1:2" {
		t.Fatalf("RedisClusterAddrs = %q", got)
	}
}

func TestRedisSentinel(t *testing.T) {
	m := StartRedis(t)
	s := StartRedisSentinel(t, m, "mymaster")
	out := s.CLI("sentinel", "get-master-addr-by-name", "mymaster")
	if !strings.Contains(out, strconv.Itoa(m.Port)) {
		t.Fatalf("sentinel reports master %q, want port %d", out, m.Port)
	}
}
