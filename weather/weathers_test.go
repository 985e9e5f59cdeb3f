package weather

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// weather is one kind of trouble of the store or of a server.
type weather struct {
	name string // the table's row
	what string // what it does, for the table's legend
	// short and full are how long it lasts in the short matrix (0: not
	// in it) and in the full one.
	short, full time.Duration
	// shortServers are the topologies the short matrix runs it in (the
	// full matrix: one server and three).
	shortServers []int
	// apply brings the weather on for d and returns once it has ended.
	apply func(w *world, d time.Duration)
}

// weathers is the matrix's rows. The toxics are toxiproxy's; latency adds
// to Redis's answers (so to each round trip), the others act both ways.
var weathers = []weather{
	{name: "healthy", what: "nothing: the store as it is", short: 2 * time.Second, full: 4 * time.Second, shortServers: []int{3},
		apply: func(_ *world, d time.Duration) { time.Sleep(d) }},
	{name: "slow 30ms", what: "toxiproxy latency: every round trip 30 ms slower (below the 50 ms timeout)",
		short: 3 * time.Second, full: 6 * time.Second, shortServers: []int{1},
		apply: toxicFor("latency", `{"latency": 30}`, false)},
	{name: "slow 120ms", what: "toxiproxy latency: every round trip 120 ms slower (over the timeout)",
		full: 5 * time.Second, apply: toxicFor("latency", `{"latency": 120}`, false)},
	{name: "DEBUG SLEEP", what: "DEBUG SLEEP: Redis blocked, connections open",
		short: 2 * time.Second, full: 2 * time.Second, shortServers: []int{1},
		apply: func(w *world, d time.Duration) {
			w.redis.Do("DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
		}},
	{name: "CLIENT PAUSE", what: "CLIENT PAUSE: Redis answers no client",
		short: 2 * time.Second, full: 2 * time.Second, shortServers: []int{3},
		apply: func(w *world, d time.Duration) {
			w.redis.Do("CLIENT", "PAUSE", strconv.FormatInt(d.Milliseconds(), 10))
			time.Sleep(d)
		}},
	{name: "stall 5s", what: "toxiproxy timeout 0: no byte passes either way (a partition); Redis keeps its data",
		full: 5 * time.Second, apply: toxicFor("timeout", `{"timeout": 0}`, true)},
	{name: "resets", what: "toxiproxy reset_peer: every connection reset as it sends",
		full: 4 * time.Second, apply: toxicFor("reset_peer", `{"timeout": 0}`, true)},
	{name: "refused", what: "the proxy stops listening: connections refused",
		full: 4 * time.Second, apply: func(w *world, d time.Duration) {
			w.proxy.Stop()
			time.Sleep(d)
			if err := w.proxy.Start(); err != nil {
				w.t.Errorf("proxy start again: %v", err)
			}
		}},
	{name: "bandwidth", what: "toxiproxy bandwidth: Redis's answers at 1 KB/s",
		full: 4 * time.Second, apply: toxicFor("bandwidth", `{"rate": 1}`, false)},
	{name: "restart empty", what: "redis-server killed, down, then started again without persistence (empty)",
		short: 2 * time.Second, full: 10 * time.Second, shortServers: []int{1, 3},
		apply: func(w *world, d time.Duration) {
			w.redis.Kill()
			time.Sleep(d)
			w.redis.Restart()
		}},
	{name: "restart at once", what: "redis-server killed and started again at once without persistence (a failover to a replica that lagged)",
		full: time.Millisecond, apply: func(w *world, _ time.Duration) {
			w.redis.Kill()
			w.redis.Restart()
		}},
	{name: "host stall", what: "SIGSTOP of one sluice server, then SIGCONT",
		short: 2 * time.Second, full: 3 * time.Second, shortServers: []int{3},
		apply: func(w *world, d time.Duration) {
			w.servers[0].signal(syscall.SIGSTOP)
			time.Sleep(d)
			w.servers[0].signal(syscall.SIGCONT)
		}},
	{name: "CPU starved", what: "one sluice server pinned to CPU 0 beside 3 busy loops pinned there (it gets about a quarter of one core)",
		full: 4 * time.Second, apply: starve},
}

// toxicFor returns a weather that adds the toxic for d.
func toxicFor(kind, attrs string, both bool) func(*world, time.Duration) {
	return func(w *world, d time.Duration) {
		w.toxic(kind, attrs, both)
		time.Sleep(d)
		w.clearToxics()
	}
}

// hogs is how many busy loops share CPU 0 with a starved server.
const hogs = 3

// starve pins server 0 (every thread) to CPU 0 with hogs busy loops (sh,
// at the same priority) pinned there for d, then lets it run on every CPU
// again. Chosen over GOMAXPROCS=1 because it starves a server started
// with its defaults, as a noisy neighbour does, without a flag.
func starve(w *world, d time.Duration) {
	pid := strconv.Itoa(w.servers[0].cmd.Process.Pid)
	all := allCPUs(w, pid)
	if out, err := exec.Command("taskset", "-a", "-p", "-c", "0", pid).CombinedOutput(); err != nil {
		w.t.Errorf("taskset: %v\n%s", err, out)
		return
	}
	var busy []*exec.Cmd
	for range hogs {
		c := exec.Command("taskset", "-c", "0", "sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			w.t.Errorf("busy loop: %v", err)
			break
		}
		busy = append(busy, c)
	}
	time.Sleep(d)
	for _, c := range busy {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	if out, err := exec.Command("taskset", "-a", "-p", "-c", all, pid).CombinedOutput(); err != nil {
		w.t.Errorf("taskset back: %v\n%s", err, out)
	}
}

// allCPUs returns the CPU list pid may run on now, such as "0,1".
func allCPUs(w *world, pid string) string {
	out, err := exec.Command("taskset", "-p", "-c", pid).Output()
	if err != nil {
		w.t.Errorf("taskset -p %s: %v", pid, err)
		return "0"
	}
	// "pid 123's current affinity list: 0,1"
	s := string(out)
	return strings.TrimSpace(s[strings.LastIndex(s, ":")+1:])
}
