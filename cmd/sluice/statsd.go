package main

import (
	"log/slog"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/metrics"
)

// statsdFlags send Envoy ratelimit's counters (--envoy-metrics) to a
// statsd server, as Envoy's ratelimit does with USE_STATSD.
type statsdFlags struct {
	addr  string        // host:port, or "" for none
	every time.Duration // how often the counts are sent
}

// defaultStatsdFlush is --statsd-flush-interval's default: Envoy's
// STATS_FLUSH_INTERVAL.
const defaultStatsdFlush = 10 * time.Second

func (f *statsdFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&f.addr, 0, "statsd-addr", "", withEnv("statsd-addr",
		"host:port of a statsd server (UDP) to send Envoy ratelimit's counters to, by Envoy's names (with --envoy-metrics); none by default"))
	fs.DurationVar(&f.every, 0, "statsd-flush-interval", defaultStatsdFlush, withEnv("statsd-flush-interval",
		"how often --statsd-addr gets what the counters counted since"))
}

// check refuses settings that cannot work: statsd without Envoy's
// counters, or an interval that is not positive.
func (f statsdFlags) check(envoyMetrics bool) error {
	if f.addr == "" {
		return nil
	}
	if !envoyMetrics {
		return usageError("--statsd-addr sends Envoy ratelimit's counters: set --envoy-metrics too")
	}
	if f.every <= 0 {
		return usageError("--statsd-flush-interval %v: want more than 0", f.every)
	}
	return nil
}

// statsdResolve is how often the statsd server's name is looked up again,
// so that a new address behind it is found.
const statsdResolve = 30 * time.Second

// startStatsd sends what m's Envoy counters count to the statsd server at
// f.addr every f.every, from a goroutine of its own, until the function
// it returns is called; that sends what is left and stops. A server that
// cannot be reached, or whose name does not resolve yet, is logged once;
// the counts wait for the next flush.
func startStatsd(m *metrics.Metrics, f statsdFlags, log *slog.Logger) func() error {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var client statsd.Statter
		warned := false
		warn := func(msg string, err error) {
			if !warned {
				log.Warn(msg, "statsd_addr", f.addr, "err", err)
				warned = true
			}
		}
		flush := func() {
			if client == nil {
				c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{
					Address: f.addr, UseBuffered: true, ResInterval: statsdResolve,
				})
				if err != nil {
					warn("statsd server not reachable; counts kept for the next flush", err)
					return
				}
				client = c
			}
			m.FlushEnvoy(func(name string, delta uint64) {
				if err := client.Inc(name, int64(delta), 1); err != nil {
					warn("statsd send failed", err)
				}
			})
		}
		t := time.NewTicker(f.every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				flush()
			case <-stop:
				flush()
				if client != nil {
					if err := client.Close(); err != nil {
						log.Warn("statsd client close", "err", err)
					}
				}
				return
			}
		}
	}()
	return func() error {
		close(stop)
		<-done
		return nil
	}
}
