// Package loadgen loads a running sluice with decisions, as `sluice bench`
// does: Envoy's gRPC rate limit API (or POST /v1/decide) called by
// Config.Concurrency callers for Config.Duration, each request one
// descriptor {Key: user-N} for N drawn below Config.Users, uniformly or
// from a Zipf distribution. Requests are encoded in advance and of each
// gRPC answer only the overall code is read, so that the load generator
// leaves the CPU it shares with the server to the server.
//
// The load is closed (each caller calls again as soon as answered) unless
// Config.Rate paces it: an open load of that many calls a second spread
// over the callers, so that servers of different speeds are offered the
// same calls and what each admits compares.
package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Config is a load. A zero field means its default, as DefaultConfig
// states; one of GRPCAddr and HTTPURL is required.
type Config struct {
	GRPCAddr string // Envoy's gRPC API at this address
	HTTPURL  string // or POST /v1/decide at this base URL, such as http://127.0.0.1:8080
	// Users is how many distinct users the requests are for. Default 10,000.
	Users int
	// Concurrency is how many callers call at once, each waiting for its
	// answer before the next call. Default 50.
	Concurrency int
	// Conns is how many gRPC connections the callers share. Default 2.
	Conns int
	// Duration is how long to load. Default 10s.
	Duration time.Duration
	// Domain is the requests' domain. Default "api".
	Domain string
	// Key is the descriptor key whose value is the user. Default "user".
	Key string
	// Zipf draws users from a Zipf distribution of this exponent, above 1
	// (user-0 the most frequent); 0, the default: uniformly.
	Zipf float64
	// Rate is the calls a second offered in all, spread evenly over the
	// callers: caller w's k-th call is due at the start plus
	// (k × Concurrency + w) / Rate seconds, and a caller still waiting for
	// an answer at a due instant calls as soon as answered (Result shows
	// the rate reached). A paced call's latency runs from its due instant,
	// so that the time it waited behind a slow answer counts, as it would
	// for a client arriving then (no coordinated omission). At most
	// MaxRate; 0, the default: no pacing, each caller calls again as soon
	// as answered.
	Rate int
}

// MaxRate is the most calls a second Config.Rate may offer.
const MaxRate = 10_000_000

// DefaultConfig returns the load of every zero field.
func DefaultConfig() Config {
	return Config{
		Users:       10000,            // enough that the store holds many keys
		Concurrency: 50,               // more calls in flight than two cores serve at once
		Conns:       2,                // HTTP/2 streams spread over two connections
		Duration:    10 * time.Second, // long enough for a stable rate
		Domain:      "api",            // examples/rules.yaml's
		Key:         "user",
	}
}

// Result is what the callers saw.
type Result struct {
	OK, Over, Failed int
	// Modes counts the answers the server's store did not decide, by the
	// fail mode that did (fail_open, fail_closed, local, slow), as each
	// answer says (sluice_mode in its dynamic_metadata); they are counted
	// in OK and Over too.
	Modes     map[string]int
	FirstErr  error           // the first call that failed, if any
	Elapsed   time.Duration   // from the first caller's start to the last's end
	Latencies []time.Duration // of every call, sorted
}

// answer is what a caller reads of an answer: whether it was over the
// limit, and the fail mode that decided it ("": the store).
type answer struct {
	over bool
	mode string
}

// caller makes one call for user u and returns its answer.
type caller func(ctx context.Context, u int) (answer, error)

// Run loads the server c names until c.Duration has passed or ctx ends,
// and returns what the callers saw. A first call that fails (a wrong
// address) is an error.
func Run(ctx context.Context, c Config) (*Result, error) {
	c = c.withDefaults()
	if (c.GRPCAddr == "") == (c.HTTPURL == "") {
		return nil, fmt.Errorf("loadgen: want one of GRPCAddr and HTTPURL")
	}
	if c.Rate < 0 || c.Rate > MaxRate {
		return nil, fmt.Errorf("loadgen: Rate %d: want 0 to %d calls a second", c.Rate, MaxRate)
	}
	var (
		call    caller
		cleanup func()
		err     error
	)
	if c.GRPCAddr != "" {
		call, cleanup, err = grpcCaller(c)
	} else {
		call, cleanup, err = httpCaller(c)
	}
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// One call first, so that a wrong address fails at once.
	if _, err := call(ctx, 0); err != nil {
		return nil, fmt.Errorf("first call: %w", err)
	}
	return load(ctx, c, call), nil
}

// withDefaults returns c with its zero fields set to DefaultConfig's.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	for _, f := range []struct{ v, def *int }{{&c.Users, &d.Users}, {&c.Concurrency, &d.Concurrency}, {&c.Conns, &d.Conns}} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.Duration == 0 {
		c.Duration = d.Duration
	}
	if c.Domain == "" {
		c.Domain = d.Domain
	}
	if c.Key == "" {
		c.Key = d.Key
	}
	return c
}

// load runs c.Concurrency callers of call for c.Duration. They stop
// starting calls at the deadline and finish the ones in flight, so that
// no call is cut short and counted as an error.
func load(ctx context.Context, c Config, call caller) *Result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	per := make([]Result, c.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(c.Duration)
	// due returns when caller w's k-th call is due (Config.Rate), or the
	// zero time for an unpaced load.
	due := func(w, k int) time.Time {
		if c.Rate == 0 {
			return time.Time{}
		}
		n := float64(k)*float64(c.Concurrency) + float64(w)
		return start.Add(time.Duration(n / float64(c.Rate) * float64(time.Second)))
	}
	for w := range per {
		wg.Go(func() {
			r := &per[w]
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			user := func() int { return rng.IntN(c.Users) }
			if c.Zipf != 0 {
				z := rand.NewZipf(rng, c.Zipf, 1, uint64(c.Users-1))
				user = func() int { return int(z.Uint64()) }
			}
			for k := 0; ctx.Err() == nil; k++ {
				at := due(w, k)
				if !at.IsZero() && (at.After(end) || !sleepUntil(ctx, at)) {
					return
				}
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				from := t0 // when the latency starts: a paced call's due instant
				if !at.IsZero() && at.Before(t0) {
					from = at
				}
				a, err := call(ctx, user())
				d := time.Since(from)
				switch {
				case err != nil && ctx.Err() != nil:
					return // interrupted
				case err != nil:
					r.Failed++
					if r.FirstErr == nil {
						r.FirstErr = err
					}
				case a.over:
					r.Over++
				default:
					r.OK++
				}
				if err == nil && a.mode != "" {
					if r.Modes == nil {
						r.Modes = map[string]int{}
					}
					r.Modes[a.mode]++
				}
				r.Latencies = append(r.Latencies, d)
			}
		})
	}
	wg.Wait()
	total := &Result{Elapsed: time.Since(start), Modes: map[string]int{}}
	for i := range per {
		for m, n := range per[i].Modes {
			total.Modes[m] += n
		}
		total.OK += per[i].OK
		total.Over += per[i].Over
		total.Failed += per[i].Failed
		if total.FirstErr == nil {
			total.FirstErr = per[i].FirstErr
		}
		total.Latencies = append(total.Latencies, per[i].Latencies...)
	}
	slices.Sort(total.Latencies)
	return total
}

// sleepUntil waits until t, and reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Percentile returns the latency below which a share p (0 to 1) of the
// calls took.
func (r *Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(float64(len(r.Latencies)-1) * p)
	return r.Latencies[i]
}

// requests builds one request per user, so that the callers spend no time
// building them.
func requests(c Config) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, c.Users)
	for u := range reqs {
		reqs[u] = &rlsv3.RateLimitRequest{
			Domain: c.Domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: c.Key, Value: fmt.Sprintf("user-%d", u)}},
			}},
		}
	}
	return reqs
}
