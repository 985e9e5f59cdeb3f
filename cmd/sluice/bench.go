package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/peterbourgon/ff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// benchConfig is what `sluice bench` is told.
type benchConfig struct {
	grpcAddr    string
	httpURL     string
	users       int
	concurrency int
	conns       int
	duration    time.Duration
	domain      string
	key         string
	zipf        float64
}

func benchCommand(stdout io.Writer) *ff.Command {
	var c benchConfig
	fs := ff.NewFlagSet("bench")
	fs.StringVar(&c.grpcAddr, 0, "grpc-addr", "", withEnv("grpc-addr", "load Envoy's gRPC API at this address"))
	fs.StringVar(&c.httpURL, 0, "http-url", "", "load POST /v1/decide at this base URL instead, such as http://127.0.0.1:8080")
	fs.IntVar(&c.users, 0, "users", 10000, "distinct users: each request is for one at random")
	fs.IntVar(&c.concurrency, 0, "concurrency", 50, "concurrent callers, each waiting for its answer before the next call")
	fs.IntVar(&c.conns, 0, "conns", 2, "gRPC connections the callers share")
	fs.DurationVar(&c.duration, 0, "duration", 10*time.Second, "how long to load")
	fs.StringVar(&c.domain, 0, "domain", "api", "the requests' domain")
	fs.StringVar(&c.key, 0, "key", "user", "the descriptor key whose value is the user")
	fs.Float64Var(&c.zipf, 0, "zipf", 0, "draw users from a Zipf distribution of this exponent (above 1; user-0 the most frequent) instead of uniformly; 0: uniform")
	return &ff.Command{
		Name:      "bench",
		Usage:     "sluice bench --grpc-addr ADDR | --http-url URL [FLAGS]",
		ShortHelp: "load a running sluice and report decisions/s and latency",
		LongHelp: "Calls ShouldRateLimit (or POST /v1/decide) from --concurrency callers for --duration,\n" +
			"each request one descriptor {key: user-N} for N at random below --users, and prints\n" +
			"the rate of decisions, their verdicts and latency percentiles.",
		Flags: fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("bench: unexpected arguments %q", args)
			}
			if (c.grpcAddr == "") == (c.httpURL == "") {
				return usageError("bench: give one of --grpc-addr and --http-url")
			}
			if c.users < 1 || c.concurrency < 1 || c.conns < 1 || c.duration <= 0 {
				return usageError("bench: --users, --concurrency, --conns and --duration must be positive")
			}
			if c.zipf != 0 && !(c.zipf > 1 && c.zipf <= 10) {
				return usageError("bench: --zipf must be above 1 and at most 10, or 0")
			}
			// The load generator's garbage is short-lived; collecting it
			// less often leaves more of a shared machine's CPU to the
			// server under test.
			debug.SetGCPercent(400)
			res, err := bench(ctx, c)
			if err != nil {
				return err
			}
			res.print(stdout, c)
			return nil
		},
	}
}

// benchResult is what the callers saw.
type benchResult struct {
	ok, over, failed int
	firstErr         error
	elapsed          time.Duration
	latencies        []time.Duration // sorted
}

// caller makes one call for user u and reports whether it was over the
// limit.
type caller func(ctx context.Context, u int) (over bool, err error)

// bench runs the load described by c.
func bench(ctx context.Context, c benchConfig) (*benchResult, error) {
	var (
		call    caller
		cleanup func()
		err     error
	)
	if c.grpcAddr != "" {
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

	// The callers stop starting calls at the deadline and finish the ones
	// in flight, so that no call is cut short and counted as an error.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	per := make([]benchResult, c.concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(c.duration)
	for w := range per {
		wg.Add(1)
		go func(r *benchResult) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			user := func() int { return rng.IntN(c.users) }
			if c.zipf != 0 {
				z := rand.NewZipf(rng, c.zipf, 1, uint64(c.users-1))
				user = func() int { return int(z.Uint64()) }
			}
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				over, err := call(ctx, user())
				d := time.Since(t0)
				switch {
				case err != nil && ctx.Err() != nil:
					return // interrupted
				case err != nil:
					r.failed++
					if r.firstErr == nil {
						r.firstErr = err
					}
				case over:
					r.over++
				default:
					r.ok++
				}
				r.latencies = append(r.latencies, d)
			}
		}(&per[w])
	}
	wg.Wait()
	total := &benchResult{elapsed: time.Since(start)}
	for i := range per {
		total.ok += per[i].ok
		total.over += per[i].over
		total.failed += per[i].failed
		if total.firstErr == nil {
			total.firstErr = per[i].firstErr
		}
		total.latencies = append(total.latencies, per[i].latencies...)
	}
	slices.Sort(total.latencies)
	return total, nil
}

func (r *benchResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(float64(len(r.latencies)-1) * p)
	return r.latencies[i]
}

func (r *benchResult) print(w io.Writer, c benchConfig) {
	target := "gRPC " + c.grpcAddr
	if c.httpURL != "" {
		target = "HTTP " + strings.TrimSuffix(c.httpURL, "/") + "/v1/decide"
	}
	n := r.ok + r.over + r.failed
	dist := "uniform"
	if c.zipf != 0 {
		dist = fmt.Sprintf("zipf %g", c.zipf)
	}
	fmt.Fprintf(w, "target:      %s, %d callers, %d users (%s), %v\n", target, c.concurrency, c.users, dist, c.duration)
	fmt.Fprintf(w, "decisions:   %d (OK %d, OVER_LIMIT %d, errors %d)\n", n, r.ok, r.over, r.failed)
	fmt.Fprintf(w, "rate:        %.0f decisions/s\n", float64(n)/r.elapsed.Seconds())
	fmt.Fprintf(w, "latency:     p50 %v  p90 %v  p99 %v  p99.9 %v  max %v\n",
		r.percentile(.5).Round(time.Microsecond), r.percentile(.9).Round(time.Microsecond),
		r.percentile(.99).Round(time.Microsecond), r.percentile(.999).Round(time.Microsecond),
		r.percentile(1).Round(time.Microsecond))
	if r.firstErr != nil {
		fmt.Fprintf(w, "first error: %v\n", r.firstErr)
	}
}

// requests builds one request per user, so that the callers spend no time
// building them.
func requests(c benchConfig) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, c.users)
	for u := range reqs {
		reqs[u] = &rlsv3.RateLimitRequest{
			Domain: c.domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: c.key, Value: fmt.Sprintf("user-%d", u)}},
			}},
		}
	}
	return reqs
}

func grpcCaller(c benchConfig) (caller, func(), error) {
	conns := make([]*grpc.ClientConn, c.conns)
	cleanup := func() {
		for _, cc := range conns {
			if cc != nil {
				cc.Close()
			}
		}
	}
	for i := range conns {
		cc, err := grpc.NewClient(c.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("dial %s: %w", c.grpcAddr, err)
		}
		conns[i] = cc
	}
	// The requests are encoded once, and of each answer only the overall
	// code is read, so that the load generator leaves the CPU it shares
	// with the server to the server, as wrk does for HTTP. The first call
	// is decoded in full to check that the server answers.
	encoded := make([][]byte, c.users)
	for u, req := range requests(c) {
		b, err := proto.Marshal(req)
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
		encoded[u] = b
	}
	first := true // bench makes the first call before the callers start
	opt := grpc.ForceCodecV2(leanCodec{})
	return func(ctx context.Context, u int) (bool, error) {
		cc := conns[u%len(conns)]
		if first {
			first = false
			req := &rlsv3.RateLimitRequest{}
			if err := proto.Unmarshal(encoded[u], req); err != nil {
				return false, err
			}
			resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
			if err != nil {
				return false, err
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN || len(resp.GetStatuses()) != 1 {
				return false, fmt.Errorf("unexpected answer %v", resp)
			}
			return resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, nil
		}
		var code overallCode
		if err := cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawMessage(encoded[u]), &code, opt); err != nil {
			return false, err
		}
		if code == 0 {
			return false, errors.New("answer without an overall code")
		}
		return code == overallCode(rlsv3.RateLimitResponse_OVER_LIMIT), nil
	}, cleanup, nil
}

// rawMessage is a request already in protobuf's wire format.
type rawMessage []byte

// overallCode is the overall_code of a RateLimitResponse.
type overallCode int32

// leanCodec sends rawMessages as they are and reads only the overall code
// of answers: field 1, which protobuf encoders write first.
type leanCodec struct{}

func (leanCodec) Name() string { return "proto" }

func (leanCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(rawMessage)
	if !ok {
		return nil, fmt.Errorf("lean codec: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m)}, nil
}

func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c, ok := v.(*overallCode)
	if !ok {
		return fmt.Errorf("lean codec: cannot read into %T", v)
	}
	*c = 0
	if len(data) == 0 {
		return nil
	}
	b := data[0].ReadOnlyData()
	// Tag 0x08 is field 1 as a varint; the codes fit in one byte.
	if len(b) >= 2 && b[0] == 0x08 && b[1] < 0x80 {
		*c = overallCode(b[1])
	}
	return nil
}

func httpCaller(c benchConfig) (caller, func(), error) {
	url := strings.TrimSuffix(c.httpURL, "/") + "/v1/decide"
	bodies := make([][]byte, c.users)
	for u, req := range requests(c) {
		b, err := protojson.Marshal(req)
		if err != nil {
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
		bodies[u] = b
	}
	tr := &http.Transport{MaxIdleConns: c.concurrency, MaxIdleConnsPerHost: c.concurrency, DisableCompression: true}
	client := &http.Client{Transport: tr}
	overLimit := []byte(`"overallCode":"OVER_LIMIT"`)
	return func(ctx context.Context, u int) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[u]))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, err
		}
		if resp.StatusCode != http.StatusOK {
			return false, errors.New(resp.Status + ": " + strings.TrimSpace(string(body)))
		}
		return bytes.Contains(body, overLimit), nil
	}, tr.CloseIdleConnections, nil
}
