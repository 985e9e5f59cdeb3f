package server

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// statsdListener is a statsd server for a test: a UDP socket on loopback
// that sums the counters of the lines it receives.
type statsdListener struct {
	conn net.PacketConn
	mu   sync.Mutex
	sums map[string]int64
	bad  []string // lines that are not name:value|c
	done chan struct{}
}

func listenStatsd(t *testing.T) *statsdListener {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &statsdListener{conn: conn, sums: map[string]int64{}, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		buf := make([]byte, 65536)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			l.mu.Lock()
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				name, rest, ok := strings.Cut(line, ":")
				value, typ, ok2 := strings.Cut(rest, "|")
				v, err := strconv.ParseInt(value, 10, 64)
				if !ok || !ok2 || typ != "c" || err != nil {
					l.bad = append(l.bad, line)
					continue
				}
				l.sums[name] += v
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-l.done
	})
	return l
}

// sum returns what the counter name summed to so far, and the bad lines.
func (l *statsdListener) sum(name string) (int64, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sums[name], append([]string(nil), l.bad...)
}

// TestServeEnvoyStatsd runs a server with Envoy's metrics sent to statsd
// (as Envoy's USE_STATSD, STATSD_HOST, STATSD_PORT, STATS_FLUSH_INTERVAL
// ask) toward a real UDP listener: it receives Envoy's counters by Envoy's names, with
// the hits of each flush interval, and what is left when serve stops.
func TestServeEnvoyStatsd(t *testing.T) {
	t.Parallel()
	l := listenStatsd(t)
	_, port, _ := net.SplitHostPort(l.conn.LocalAddr().String())
	c := testConfig(copyRules(t, exampleRules))
	c.Envoy = EnvoyConfig{Metrics: true, StatsdAddr: net.JoinHostPort("127.0.0.1", port), StatsdFlushInterval: 50 * time.Millisecond}
	s := startServer(t, c)
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"statsd"},{"key":"path","value":"/login"}]}]}`
	for range 3 {
		if r := s.do(t, "POST", "/json", body); r.code != 200 {
			t.Fatalf("POST /json = %d %s", r.code, r.body)
		}
	}
	const hits = "ratelimit.service.rate_limit.api.user.path_/login.total_hits"
	eventually(t, "3 hits counted by statsd", func() bool { n, _ := l.sum(hits); return n == 3 })
	if n, _ := l.sum("ratelimit.service.rate_limit.api.user.path_/login.within_limit"); n != 3 {
		t.Errorf("within_limit = %d, want 3", n)
	}
	if n, _ := l.sum("ratelimit.service.config_load_success"); n != 1 {
		t.Errorf("config_load_success = %d, want 1", n)
	}
	// What counts after the last flush is sent when serve stops.
	if r := s.do(t, "POST", "/json", body); r.code != 200 {
		t.Fatalf("POST /json = %d %s", r.code, r.body)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the last hit sent at stop", func() bool { n, _ := l.sum(hits); return n == 4 })
	if n, bad := l.sum(hits); n != 4 || len(bad) > 0 {
		t.Errorf("total_hits = %d, want 4; lines that are no statsd counters: %q", n, bad)
	}
}

// TestStatsdRefusals checks that statsd needs Envoy's counters and a
// positive interval.
func TestStatsdRefusals(t *testing.T) {
	t.Parallel()
	for _, e := range []EnvoyConfig{
		{StatsdAddr: "127.0.0.1:8125"},
		{StatsdAddr: "127.0.0.1:8125", Metrics: true, StatsdFlushInterval: -time.Second},
	} {
		c := testConfig(exampleRules)
		c.Envoy = e
		wantConfigError(t, c, "statsd")
	}
}
