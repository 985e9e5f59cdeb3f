package envoyrls

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/transport/respond"
)

// Headers selects the rate limit headers a response carries, as a set of
// bits. The zero value selects none.
type Headers uint8

const (
	// RateLimitHeaders are the fields of the IETF draft
	// draft-ietf-httpapi-ratelimit-headers, revision 11:
	// `RateLimit-Policy: "per-user";q=100;w=60` and
	// `RateLimit: "per-user";r=0;t=12`, one item per limit.
	RateLimitHeaders Headers = 1 << iota
	// XRateLimitHeaders are X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds), of the limit that binds, as Envoy's
	// ratelimit service and Kong send them.
	XRateLimitHeaders
	// RetryAfterHeader is Retry-After, in whole seconds, on OVER_LIMIT.
	RetryAfterHeader

	// AllHeaders selects every header.
	AllHeaders = RateLimitHeaders | XRateLimitHeaders | RetryAfterHeader
)

var headerNames = []struct {
	name string
	h    Headers
}{
	{"ratelimit", RateLimitHeaders},
	{"x-ratelimit", XRateLimitHeaders},
	{"retry-after", RetryAfterHeader},
}

// ParseHeaders reads a comma-separated list of "ratelimit", "x-ratelimit"
// and "retry-after", or "all", or "none".
func ParseHeaders(s string) (Headers, error) {
	var h Headers
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		switch f {
		case "all":
			h |= AllHeaders
			continue
		case "none", "":
			continue
		}
		found := false
		for _, n := range headerNames {
			if f == n.name {
				h |= n.h
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown header set %q (want all, none, ratelimit, x-ratelimit or retry-after)", f)
		}
	}
	return h, nil
}

// String returns h in the syntax ParseHeaders reads.
func (h Headers) String() string {
	if h == 0 {
		return "none"
	}
	var names []string
	for _, n := range headerNames {
		if h&n.h != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// Config configures the Envoy rate limit service. The zero value sends no
// headers.
type Config struct {
	// Headers selects the headers added to the client's response.
	Headers Headers
	// RetryJitter is the most, in whole seconds, added at random to
	// Retry-After so that denied clients do not all retry at once. The
	// header is never earlier than the real retry time.
	RetryJitter time.Duration
}

// DefaultConfig returns the configuration sluice serve uses.
func DefaultConfig() Config {
	return Config{
		Headers:     AllHeaders, // RateLimit, RateLimit-Policy, X-RateLimit-*, Retry-After
		RetryJitter: time.Second,
	}
}

// HeaderFields returns the headers cfg selects for resp, as name/value
// pairs in a fixed order. Only enforced limits count: descriptors that no
// limit matched, unlimited ones and those in shadow mode add nothing, so a
// response without any enforced limit has no headers.
//
// Every enforced limit is one item of RateLimit-Policy and RateLimit, named
// by the rules file's `name` or else the limit's ID, with q its rate, w its
// period in seconds, r the remaining hits and t the seconds until the limit
// is whole again (rounded up). X-RateLimit-* describe the limit that binds:
// on a denial the one with the longest retry, else the one with the least
// remaining. These are the fields package transport/respond writes for the
// other HTTP ways in.
func HeaderFields(resp *decide.Response, cfg Config) [][2]string {
	var fs fieldSet
	fs.build(resp, cfg)
	if fs.n == 0 {
		return nil
	}
	return append([][2]string(nil), fs.f[:fs.n]...)
}

// fieldSet holds the header fields of one response, at most six, whose
// values share one string: one allocation for all of them.
type fieldSet struct {
	n int
	f [6][2]string
}

// build fills fs with the fields HeaderFields describes.
func (fs *fieldSet) build(resp *decide.Response, cfg Config) {
	fs.n = 0
	if cfg.Headers == 0 {
		return
	}
	tightest := respond.Binding(resp)
	if tightest < 0 {
		return
	}
	var names [6]string
	var ends [6]int
	var arr [256]byte
	b := arr[:0]
	field := func(name string) {
		names[fs.n], ends[fs.n] = name, len(b)
		fs.n++
	}
	if cfg.Headers&RateLimitHeaders != 0 {
		b = respond.AppendPolicy(b, resp)
		field("RateLimit-Policy")
		b = respond.AppendState(b, resp)
		field("RateLimit")
	}
	if cfg.Headers&XRateLimitHeaders != 0 {
		st := &resp.Statuses[tightest]
		b = strconv.AppendInt(b, respond.Quota(st), 10)
		field("X-RateLimit-Limit")
		b = strconv.AppendInt(b, max(st.Decision.Remaining, 0), 10)
		field("X-RateLimit-Remaining")
		b = strconv.AppendInt(b, respond.CeilSeconds(st.Decision.ResetAfter), 10)
		field("X-RateLimit-Reset")
	}
	if cfg.Headers&RetryAfterHeader != 0 && resp.Overall == decide.OverLimit {
		if d := resp.RetryAfter(); d != sluice.Never {
			secs := max(respond.CeilSeconds(d), 1)
			if j := int64(cfg.RetryJitter / time.Second); j > 0 {
				secs += rand.Int64N(j + 1)
			}
			b = strconv.AppendInt(b, secs, 10)
			field("Retry-After")
		}
	}
	all := string(b)
	start := 0
	for i := range fs.n {
		fs.f[i] = [2]string{names[i], all[start:ends[i]]}
		start = ends[i]
	}
}

func appendHeaders(dst []*corev3.HeaderValue, resp *decide.Response, cfg Config) []*corev3.HeaderValue {
	var fs fieldSet
	fs.build(resp, cfg)
	if fs.n == 0 {
		return dst
	}
	// The header values and their pointers in one allocation each.
	hvs := make([]corev3.HeaderValue, fs.n)
	if dst == nil {
		dst = make([]*corev3.HeaderValue, 0, fs.n)
	}
	for i, f := range fs.f[:fs.n] {
		hvs[i].Key, hvs[i].Value = f[0], f[1]
		dst = append(dst, &hvs[i])
	}
	return dst
}
