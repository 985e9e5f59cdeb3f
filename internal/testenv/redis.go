package testenv

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The environment variables through which scripts/test-env.sh hands the
// shared servers to the tests.
const (
	RedisAddrEnv         = "SLUICE_TEST_REDIS_ADDR"          // host:port of a standalone Redis
	RedisClusterAddrsEnv = "SLUICE_TEST_REDIS_CLUSTER_ADDRS" // comma-separated host:port of a Redis Cluster
)

// missing fails the test under CI=true, where the test command starts
// every server and a missing one is a broken environment, and skips it
// otherwise.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RedisAddr returns the address of the shared standalone Redis from
// $SLUICE_TEST_REDIS_ADDR. When it is unset it fails the test under
// CI=true and skips it otherwise. Tests share this server: they use keys
// of their own.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(RedisAddrEnv)
	if addr == "" {
		missing(t, "%s is unset: run the tests with scripts/test.sh, or eval \"$(scripts/test-env.sh start)\" first", RedisAddrEnv)
	}
	return addr
}

// RedisClusterAddrs returns the node addresses of the shared Redis Cluster
// from $SLUICE_TEST_REDIS_CLUSTER_ADDRS, failing or skipping as RedisAddr.
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(RedisClusterAddrsEnv)
	if v == "" {
		missing(t, "%s is unset: run the tests with scripts/test.sh, or eval \"$(scripts/test-env.sh start)\" first", RedisClusterAddrsEnv)
	}
	return strings.Split(v, ",")
}

// RedisServerBinary returns the path of redis-server, failing or skipping
// the test as RedisAddr when there is none.
func RedisServerBinary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		missing(t, "redis-server not found (scripts/test.sh installs it): %v", err)
	}
	return p
}

// redisFreePort returns a port on 127.0.0.1 that was free a moment ago,
// and whose cluster bus port (+10000) was too. Both lie below Linux's
// ephemeral range (32768-60999), where an outgoing connection could take
// the port between this check and the server's bind: the port is in
// 20000-22767, as scripts/test-env.sh's are (both check).
func redisFreePort(t testing.TB) int {
	t.Helper()
	for range 500 {
		port := 20000 + rand.IntN(2768)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port
	}
	t.Fatal("no free port with a free cluster bus port")
	return 0
}

// RedisServer is a redis-server that a test started for itself, on a free
// loopback port, so that it may kill, pause and restart it. It is stopped
// when the test ends. Its methods are safe for concurrent use.
type RedisServer struct {
	Addr string // 127.0.0.1:port
	Port int

	t    testing.TB
	bin  string
	dir  string
	args []string
	conf string // a sentinel's configuration file, or ""
	pass string // the password the server requires, or ""

	mu   sync.Mutex
	cmd  *exec.Cmd
	log  *os.File
	held []int // sockets that hold the ports of a killed server
}

// StartRedis starts a redis-server in the foreground, without persistence,
// with the extra arguments args (such as "--cluster-enabled", "yes"), and
// waits until it answers PING.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	r := &RedisServer{t: t, bin: RedisServerBinary(t), dir: t.TempDir(), args: args}
	r.Port = redisFreePort(t)
	r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
	t.Cleanup(func() {
		r.Kill()
		r.mu.Lock()
		r.release()
		r.mu.Unlock()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(r.dir, "redis.log")); err == nil && len(b) > 0 {
				t.Logf("redis-server %s log:\n%s", r.Addr, lastLines(string(b), 30))
			}
		}
	})
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *RedisServer) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return nil
	}
	r.release()
	log, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("redis-server log: %w", err)
	}
	args := append([]string{
		"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
	}, r.args...)
	if r.conf != "" {
		args = []string{r.conf, "--sentinel", "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
			"--dir", r.dir, "--daemonize", "no"}
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd, r.log = cmd, log
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if reply, err := r.do(time.Second, "PING"); err == nil && reply == "+PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s did not answer PING in 10s", r.Addr)
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit. Killing a dead server does nothing.
func (r *RedisServer) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a paused server dies too
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.log.Close()
	r.cmd, r.log = nil, nil
	r.hold()
}

// hold binds the killed server's port and cluster bus port, without
// listening on them, until start: connections to them are refused, as to a
// dead server, but no other process can take them meanwhile. Test
// processes running side by side pick their Redis ports from the same
// range, and one took a killed server's port before Restart ('bind:
// Address already in use'). Best effort: a port it cannot bind is left.
func (r *RedisServer) hold() {
	for _, port := range []int{r.Port, r.Port + 10000} {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			syscall.Close(fd)
			continue
		}
		r.held = append(r.held, fd)
	}
}

// release closes the sockets hold made.
func (r *RedisServer) release() {
	for _, fd := range r.held {
		syscall.Close(fd)
	}
	r.held = nil
}

// Restart starts a killed server again on the same port, with the same
// arguments (and, for a cluster node, its nodes.conf), and waits until it
// answers PING. A running server is left as it is.
func (r *RedisServer) Restart() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// Pause stops the server with SIGSTOP: it keeps its connections open and
// answers nothing, as a hung server would, until Resume.
func (r *RedisServer) Pause() { r.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (r *RedisServer) Resume() { r.signal(syscall.SIGCONT) }

func (r *RedisServer) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}

// Do sends one command (no argument may contain spaces) and returns the
// first line of the reply, such as "+OK", ":1" or "$12", failing the test
// on a connection error.
func (r *RedisServer) Do(args ...string) string {
	r.t.Helper()
	reply, err := r.do(5*time.Second, args...)
	if err != nil {
		r.t.Fatalf("redis %s %v: %v", r.Addr, args, err)
	}
	return reply
}

// do sends an inline command and reads the first line of the reply.
func (r *RedisServer) do(timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", r.Addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	rd := bufio.NewReader(conn)
	if r.pass != "" {
		if _, err := fmt.Fprintf(conn, "AUTH %s\r\n", r.pass); err != nil {
			return "", err
		}
		if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return strings.TrimRight(line, "\r\n"), fmt.Errorf("AUTH: %q %v", line, err)
		}
	}
	if _, err := fmt.Fprintf(conn, "%s\r\n", strings.Join(args, " ")); err != nil {
		return "", err
	}
	line, err := rd.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// CLI runs redis-cli against the server with args and returns its output,
// failing the test when it fails or takes more than 30s.
func (r *RedisServer) CLI(args ...string) string {
	r.t.Helper()
	out, err := cli(append(r.cliArgs(), args...)...)
	if err != nil {
		r.t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return out
}

func cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	return string(out), err
}

// StartRedisSentinel starts a Redis Sentinel (redis-server --sentinel) on
// a free port that monitors master under name, with a quorum of one and a
// master declared down after one second, and waits until it answers PING.
func StartRedisSentinel(t testing.TB, master *RedisServer, name string) *RedisServer {
	t.Helper()
	return startSentinel(t, master, name, "")
}

// StartRedisSentinelAuth starts a Redis Sentinel as StartRedisSentinel
// does that requires clients to authenticate with password (its
// requirepass; no spaces). The returned server's Do and CLI
// authenticate.
func StartRedisSentinelAuth(t testing.TB, master *RedisServer, name, password string) *RedisServer {
	t.Helper()
	return startSentinel(t, master, name, password)
}

func startSentinel(t testing.TB, master *RedisServer, name, password string) *RedisServer {
	t.Helper()
	r := &RedisServer{t: t, bin: RedisServerBinary(t), dir: t.TempDir(), pass: password}
	r.Port = redisFreePort(t)
	r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
	r.conf = filepath.Join(r.dir, "sentinel.conf")
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 5000\n", name, master.Port)
	if password != "" {
		conf += "requirepass " + password + "\n"
	}
	if err := os.WriteFile(r.conf, []byte(conf), 0o600); err != nil {
		t.Fatalf("write sentinel config: %v", err)
	}
	t.Cleanup(func() {
		r.Kill()
		r.mu.Lock()
		r.release()
		r.mu.Unlock()
	})
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// RedisCluster is a Redis Cluster that a test started for itself: masters
// with replicas each, on free loopback ports, with a node timeout of two
// seconds, so that a replica takes over a dead master within a few seconds
// but a busy machine does not make live nodes look dead.
type RedisCluster struct {
	Nodes []*RedisServer
	t     testing.TB
}

// StartRedisCluster starts masters × (1 + replicas) nodes, joins them with
// redis-cli --cluster create and waits until the cluster is ok.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		missing(t, "redis-cli not found (scripts/test.sh installs it): %v", err)
	}
	c := &RedisCluster{t: t}
	args := []string{"--cluster", "create"}
	for range masters * (1 + replicas) {
		// Replicas sync at once (no diskless delay) and may always take
		// over, however long ago they last heard from their master.
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0",
			"--cluster-replica-validity-factor", "0")
		c.Nodes = append(c.Nodes, n)
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := cli(args...); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(30 * time.Second)
	c.waitReplicas(30 * time.Second)
	return c
}

// waitReplicas waits until every replica's link to its master is up, so
// that a replica can take over as soon as the test kills its master.
func (c *RedisCluster) waitReplicas(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range c.Nodes {
		for {
			out, err := n.cli("info", "replication")
			if err == nil && (strings.Contains(out, "role:master") || strings.Contains(out, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("replica %s not in sync after %v:\n%s", n.Addr, timeout, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Addrs returns the nodes' addresses.
func (c *RedisCluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr)
	}
	return a
}

// WaitOK waits until every running node reports cluster_state:ok and
// agrees on one master per slot range, failing the test after timeout.
func (c *RedisCluster) WaitOK(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, n := range c.Nodes {
			out, err := n.cli("cluster", "info")
			if err != nil {
				continue // a killed node
			}
			if !strings.Contains(out, "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redis cluster not ok after %v", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *RedisServer) cli(args ...string) (string, error) {
	r.mu.Lock()
	up := r.cmd != nil
	r.mu.Unlock()
	if !up {
		return "", fmt.Errorf("redis-server %s is not running", r.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", append(r.cliArgs(), args...)...).CombinedOutput()
	return string(out), err
}

// cliArgs are redis-cli's arguments that reach the server.
func (r *RedisServer) cliArgs() []string {
	a := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.Port)}
	if r.pass != "" {
		a = append(a, "-a", r.pass, "--no-auth-warning")
	}
	return a
}

// MasterOf returns the node that a running node reports as the master of
// slot, or nil if none knows one that is up.
func (c *RedisCluster) MasterOf(slot int) *RedisServer {
	c.t.Helper()
	for _, n := range c.Nodes {
		out, err := n.cli("cluster", "nodes")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			for _, rng := range f[8:] {
				lo, hi, _ := strings.Cut(rng, "-")
				if hi == "" {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && a <= slot && slot <= b {
					addr, _, _ := strings.Cut(f[1], "@")
					for _, m := range c.Nodes {
						if m.Addr == addr {
							return m
						}
					}
				}
			}
		}
		return nil
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
