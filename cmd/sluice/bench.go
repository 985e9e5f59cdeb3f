package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/internal/loadgen"
)

func benchCommand(stdout io.Writer) *ff.Command {
	c := loadgen.DefaultConfig()
	fs := ff.NewFlagSet("bench")
	fs.StringVar(&c.GRPCAddr, 0, "grpc-addr", "", withEnv("grpc-addr", "load Envoy's gRPC API at this address"))
	fs.StringVar(&c.HTTPURL, 0, "http-url", "", "load POST /v1/decide at this base URL instead, such as http://127.0.0.1:8080")
	fs.IntVar(&c.Users, 0, "users", c.Users, "distinct users: each request is for one at random")
	fs.IntVar(&c.Concurrency, 0, "concurrency", c.Concurrency, "concurrent callers, each waiting for its answer before the next call")
	fs.IntVar(&c.Conns, 0, "conns", c.Conns, "gRPC connections the callers share")
	fs.DurationVar(&c.Duration, 0, "duration", c.Duration, "how long to load")
	fs.StringVar(&c.Domain, 0, "domain", c.Domain, "the requests' domain")
	fs.StringVar(&c.Key, 0, "key", c.Key, "the descriptor key whose value is the user")
	fs.IntVar(&c.Rate, 0, "rate", 0, "offer this many decisions a second in all, paced evenly over the callers (an open load, so that servers compare at one offered load; latency counts from each call's due instant); 0: each caller calls again as soon as answered")
	fs.Float64Var(&c.Zipf, 0, "zipf", 0, "draw users from a Zipf distribution of this exponent (above 1; user-0 the most frequent) instead of uniformly; 0: uniform")
	return &ff.Command{
		Name:      "bench",
		Usage:     "sluice bench --grpc-addr ADDR | --http-url URL [FLAGS]",
		ShortHelp: "load a running sluice and report decisions/s and latency",
		LongHelp: "Calls ShouldRateLimit (or POST /v1/decide) from --concurrency callers for --duration,\n" +
			"each request one descriptor {key: user-N} for N at random below --users, and prints\n" +
			"the rate of decisions, their verdicts and latency percentiles.\n\n" +
			"Each user is limited on its own, by the rule of --key: with the example rules (30 a second\n" +
			"each, bursts of 100), 10,000 users at 30,000 decisions a second make 3 a second each and\n" +
			"none is ever over. To make it hit limits, load fewer users (--users 10: 3,000 a second\n" +
			"each), skew the draw (--zipf 1.2: user-0 gets about a fifth of the calls), or serve rules\n" +
			"with a lower limit.",
		Flags: fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("bench: unexpected arguments %q", args)
			}
			if (c.GRPCAddr == "") == (c.HTTPURL == "") {
				return usageError("bench: give one of --grpc-addr and --http-url")
			}
			if c.Users < 1 || c.Concurrency < 1 || c.Conns < 1 || c.Duration <= 0 {
				return usageError("bench: --users, --concurrency, --conns and --duration must be positive")
			}
			if c.Rate < 0 || c.Rate > loadgen.MaxRate {
				return usageError("bench: --rate must be 0 to %d decisions a second", loadgen.MaxRate)
			}
			if c.Zipf != 0 && !(c.Zipf > 1 && c.Zipf <= 10) {
				return usageError("bench: --zipf must be above 1 and at most 10, or 0")
			}
			// The load generator's garbage is short-lived; collecting it
			// less often leaves more of a shared machine's CPU to the
			// server under test.
			debug.SetGCPercent(400)
			res, err := loadgen.Run(ctx, c)
			if err != nil {
				return err
			}
			printBench(stdout, c, res)
			return nil
		},
	}
}

// printBench prints what the load c saw.
func printBench(w io.Writer, c loadgen.Config, r *loadgen.Result) {
	target := "gRPC " + c.GRPCAddr
	if c.HTTPURL != "" {
		target = "HTTP " + strings.TrimSuffix(c.HTTPURL, "/") + "/v1/decide"
	}
	n := r.OK + r.Over + r.Failed
	dist := "uniform"
	if c.Zipf != 0 {
		dist = fmt.Sprintf("zipf %g", c.Zipf)
	}
	fmt.Fprintf(w, "target:      %s, %d callers, %d users (%s), %v\n", target, c.Concurrency, c.Users, dist, c.Duration)
	fmt.Fprintf(w, "decisions:   %d (OK %d, OVER_LIMIT %d, errors %d)\n", n, r.OK, r.Over, r.Failed)
	line := failModes(r.Modes)
	if line != "" {
		fmt.Fprintf(w, "fail mode:   %s\n", line)
	}
	if r.Over == 0 && r.OK > 0 && line == "" {
		fmt.Fprintf(w, "             none over a limit: the calls were spread over %d users, each under its own;\n"+
			"             fewer users (--users 10) or a skewed draw (--zipf 1.2) make them reach it\n", c.Users)
	}
	rate := float64(n) / r.Elapsed.Seconds()
	if c.Rate > 0 {
		fmt.Fprintf(w, "rate:        %.0f decisions/s of %d offered\n", rate, c.Rate)
		if rate < 0.95*float64(c.Rate) {
			fmt.Fprintf(w, "             under 95%% of the offered rate: the callers waited for answers; more --concurrency offers it\n")
		}
	} else {
		fmt.Fprintf(w, "rate:        %.0f decisions/s\n", rate)
	}
	p := func(q float64) time.Duration { return r.Percentile(q).Round(time.Microsecond) }
	fmt.Fprintf(w, "latency:     p50 %v  p90 %v  p99 %v  p99.9 %v  max %v\n", p(.5), p(.9), p(.99), p(.999), p(1))
	if r.FirstErr != nil {
		fmt.Fprintf(w, "first error: %v\n", r.FirstErr)
	}
}

// failModes says how many answers the server's fail mode made instead of
// its store, by mode ("" when none): an outage, or a store slower than
// --store-timeout, that "errors 0" alone would hide.
func failModes(modes map[string]int) string {
	if len(modes) == 0 {
		return ""
	}
	names := slices.Sorted(maps.Keys(modes))
	total, parts := 0, make([]string, len(names))
	for i, m := range names {
		total += modes[m]
		parts[i] = fmt.Sprintf("%s %d", m, modes[m])
	}
	return fmt.Sprintf("%d of them not decided by the store (%s): see /readyz and the server's log", total, strings.Join(parts, ", "))
}
