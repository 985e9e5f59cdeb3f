package server

import (
	"log/slog"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"

	"github.com/sluicehq/sluice/metrics"
)

// checkStatsd refuses statsd settings that cannot work: statsd without
// Envoy's counters, or an interval that is not positive.
func checkStatsd(e EnvoyConfig) error {
	if e.StatsdAddr == "" {
		return nil
	}
	if !e.Metrics {
		return configError("--statsd-addr sends Envoy ratelimit's counters: set --envoy-metrics too")
	}
	if e.StatsdFlushInterval <= 0 {
		return configError("--statsd-flush-interval %v: want more than 0", e.StatsdFlushInterval)
	}
	return nil
}

// statsdResolve is how often the statsd server's name is looked up again,
// so that a new address behind it is found.
const statsdResolve = 30 * time.Second

// startStatsd sends what m's Envoy counters count to the statsd server at
// e.StatsdAddr every e.StatsdFlushInterval, from a goroutine of its own,
// until the function it returns is called; that sends what is left and
// stops. A server that cannot be reached, or whose name does not resolve
// yet, is logged once; the counts wait for the next flush.
func startStatsd(m *metrics.Metrics, e EnvoyConfig, log *slog.Logger) func() error {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var client statsd.Statter
		warned := false
		warn := func(msg string, err error) {
			if !warned {
				log.Warn(msg, "statsd_addr", e.StatsdAddr, "err", err)
				warned = true
			}
		}
		flush := func() {
			if client == nil {
				c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{
					Address: e.StatsdAddr, UseBuffered: true, ResInterval: statsdResolve,
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
		t := time.NewTicker(e.StatsdFlushInterval)
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
