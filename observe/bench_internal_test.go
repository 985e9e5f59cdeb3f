//go:build unix

package observe

import (
	"context"
	"log/slog"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// BenchmarkCount measures what a Watcher adds to a decision: counting one
// descriptor's entry (the real service's answers, recorded first) in the
// request and, when denied, the denial sketch, clock read included; the
// denial log off ("ok", "denied") and at its default rate of 10 lines a
// second ("denied-logged": nearly every denial is sampled out).
func BenchmarkCount(b *testing.B) {
	svc := testenv.Decider(b, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", nil)
	o, err := New(Config{DenialLogRate: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	logged, err := New(Config{Logger: slog.New(slog.DiscardHandler)}) // the default 10 lines a second
	if err != nil {
		b.Fatal(err)
	}
	defer logged.Close()
	for _, bc := range []struct {
		name string
		cost int64
		n    int // decisions per user before the recorded one: 10 denies
		o    *Watcher
	}{{"ok", 1, 0, o}, {"denied", 1, 10, o}, {"denied-logged", 1, 10, logged}} {
		// The requests and their recorded answers sit side by side in
		// memory, each test case's alike: in a server, count reads an
		// answer Decide has just written, so reading it costs no cache
		// miss; answers scattered among the denied users' earlier ones
		// cost a miss each, which made "denied" look dearer than "ok".
		const users = 10000
		reqs := make([]decide.Request, users)
		descs := make([]decide.Descriptor, users)
		entries := make([]decide.Entry, users)
		resps := make([]decide.Response, users)
		statuses := make([]decide.Status, users)
		for i := range reqs {
			entries[i] = decide.Entry{Key: "user", Value: bc.name + "-" + strconv.Itoa(i)}
			descs[i] = decide.Descriptor{Entries: entries[i : i+1 : i+1], Cost: bc.cost}
			reqs[i] = decide.Request{Domain: "api", Descriptors: descs[i : i+1 : i+1]}
		}
		for i := range reqs {
			var resp *decide.Response
			for range bc.n + 1 {
				if resp, err = svc.Decide(context.Background(), &reqs[i]); err != nil {
					b.Fatal(err)
				}
			}
			resps[i], statuses[i] = *resp, resp.Statuses[0]
			resps[i].Statuses = statuses[i : i+1 : i+1]
		}
		if want := map[bool]decide.Code{true: decide.OK, false: decide.OverLimit}[bc.n == 0]; resps[0].Overall != want {
			b.Fatalf("recorded %v, want %v", resps[0].Overall, want)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			i := 0
			for b.Loop() {
				bc.o.count(&reqs[i%users], &resps[i%users])
				i++
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime returns the process's CPU time, user and system: on a machine
// shared with other work, the CPU time per operation (cpu-ns/op) is what
// the code costs, where ns/op also counts the time it waited for a core.
// The benchmark is the process's only busy goroutine.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
