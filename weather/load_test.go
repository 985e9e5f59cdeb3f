package weather

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/transport/envoyrls"
)

// modes are the sync modes every weather is measured in, each on its own
// descriptor keys of rulesYAML.
var modes = []string{"exact", "lease", "async"}

// plan is a run's load and timeline: warm before the weather, the
// weather, after it. Every mode is loaded at once, on its own keys.
type plan struct {
	warm, after time.Duration
	// underClients clients per mode each send underRate calls a second
	// under a limit of underLimit a second (their own counters).
	underClients int
	underLimit   int
	underRate    float64
	// One client per mode sends overTimes × overLimit calls under a limit
	// of overLimit an hour, evenly from an instant chosen so that it has
	// sent half its limit when the weather begins (the store counted them)
	// and reaches its limit soon after, while the weather is on; in a
	// weather so long that this instant would come before the start, it
	// starts at once and has sent less by then.
	overLimit int
	overTimes float64
}

// shortPlan is the CI matrix's: 10 clients a mode at a fifth of 50 a
// second, one at 6× 100 an hour; about 560 calls a second in all.
func shortPlan() plan {
	return plan{warm: time.Second, after: 3 * time.Second, underClients: 10, underLimit: 50, underRate: 10,
		overLimit: 100, overTimes: 6}
}

// fullPlan is the full matrix's: 20 clients a mode at a fifth of 50 a
// second, one at 6× 300 an hour.
func fullPlan() plan {
	return plan{warm: 2 * time.Second, after: 5 * time.Second, underClients: 20, underLimit: 50, underRate: 10,
		overLimit: 300, overTimes: 6}
}

// call is one call's outcome.
type call struct {
	sent     time.Duration // since the load began
	mode     int           // index in modes
	server   int           // index in world.servers
	over     bool          // of the client over its limit
	admitted bool
	err      bool
	fail     string // the fail mode that decided it (sluice_mode); "": the store
}

// callTimeout is how long a client waits for an answer: longer than any
// weather lasts, so that a stalled server's calls are answered late, not
// counted as errors of the client's making.
const callTimeout = 15 * time.Second

// load is an open load on a world's servers: each client sends at its
// pace whether or not its earlier calls were answered, each call to the
// next server in turn.
type load struct {
	w     *world
	start time.Time
	rr    atomic.Uint64
	wg    sync.WaitGroup
	mu    sync.Mutex
	calls []call
}

// run loads w's servers for total, every mode at once, and returns every
// call's outcome once all are answered. It starts now: weather offsets
// are from the time it returns through started.
func (l *load) run(p plan, total time.Duration, started chan<- time.Time) []call {
	l.start = time.Now()
	started <- l.start
	var streams sync.WaitGroup
	// Half the limit sent by warm: overTimes × (warm − from)/(total − from) = 1/2.
	k := 2 * p.overTimes
	from := max(0, time.Duration((k*float64(p.warm)-float64(total))/(k-1)))
	overRate := p.overTimes * float64(p.overLimit) / (total - from).Seconds()
	for m, mode := range modes {
		for c := range p.underClients {
			streams.Go(func() { l.stream(m, false, "under_"+mode, fmt.Sprintf("c%d", c), 0, p.underRate, total) })
		}
		streams.Go(func() { l.stream(m, true, "over_"+mode, "o", from, overRate, total) })
	}
	streams.Wait()
	l.wg.Wait()
	return l.calls
}

// stream sends calls for one client at rate a second from from until
// total has passed since the start, at a random phase, each in a
// goroutine of its own.
func (l *load) stream(mode int, over bool, key, value string, from time.Duration, rate float64, total time.Duration) {
	req := &rlsv3.RateLimitRequest{Domain: "weather", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
	}}}
	period := time.Duration(float64(time.Second) / rate)
	phase := time.Duration(rand.Int64N(int64(period)))
	for k := 0; ; k++ {
		at := from + phase + time.Duration(k)*period
		if at >= total {
			return
		}
		time.Sleep(time.Until(l.start.Add(at))) // pacing an open load, not waiting for a condition
		l.wg.Go(func() { l.one(req, mode, over) })
	}
}

// one makes one call and records it.
func (l *load) one(req *rlsv3.RateLimitRequest, mode int, over bool) {
	i := int(l.rr.Add(1) % uint64(len(l.w.servers)))
	s := l.w.servers[i]
	c := call{sent: time.Since(l.start), mode: mode, server: i, over: over}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(s.conn).ShouldRateLimit(ctx, req)
	switch {
	case err != nil || resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN:
		c.err = true
	default:
		c.admitted = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
		c.fail = resp.GetDynamicMetadata().GetFields()[envoyrls.ModeKey].GetStringValue()
	}
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}
