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
	return appendHeaderFields(nil, resp, cfg)
}

// appendHeaderFields appends the fields of HeaderFields to out.
func appendHeaderFields(out [][2]string, resp *decide.Response, cfg Config) [][2]string {
	if cfg.Headers == 0 {
		return out
	}
	tightest := -1
	var pbuf, sbuf [128]byte
	policy, state := pbuf[:0], sbuf[:0]
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Limit == nil || st.Shadow {
			continue
		}
		if tightest < 0 || binds(st, &resp.Statuses[tightest]) {
			tightest = i
		}
		if cfg.Headers&RateLimitHeaders == 0 {
			continue
		}
		name := st.Limit.Name
		if name == "" {
			name = st.Limit.ID
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
			state = append(state, ", "...)
		}
		policy = appendSFString(policy, name)
		policy = append(policy, ";q="...)
		policy = strconv.AppendInt(policy, st.Limit.Limit.Rate, 10)
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, ceilSeconds(st.Limit.Period()), 10)
		state = appendSFString(state, name)
		state = append(state, ";r="...)
		state = strconv.AppendInt(state, max(st.Decision.Remaining, 0), 10)
		state = append(state, ";t="...)
		state = strconv.AppendInt(state, ceilSeconds(st.Decision.ResetAfter), 10)
	}
	if tightest < 0 {
		return out
	}
	if len(policy) > 0 {
		out = append(out, [2]string{"RateLimit-Policy", string(policy)}, [2]string{"RateLimit", string(state)})
	}
	if cfg.Headers&XRateLimitHeaders != 0 {
		st := &resp.Statuses[tightest]
		out = append(out,
			[2]string{"X-RateLimit-Limit", strconv.FormatInt(st.Limit.Limit.Rate, 10)},
			[2]string{"X-RateLimit-Remaining", strconv.FormatInt(max(st.Decision.Remaining, 0), 10)},
			[2]string{"X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(st.Decision.ResetAfter), 10)})
	}
	if cfg.Headers&RetryAfterHeader != 0 && resp.Overall == decide.OverLimit {
		if d := resp.RetryAfter(); d != sluice.Never {
			s := max(ceilSeconds(d), 1)
			if j := int64(cfg.RetryJitter / time.Second); j > 0 {
				s += rand.Int64N(j + 1)
			}
			out = append(out, [2]string{"Retry-After", strconv.FormatInt(s, 10)})
		}
	}
	return out
}

// binds reports whether a describes a tighter limit than b: over the limit
// before allowed, then a longer retry, then fewer remaining.
func binds(a, b *decide.Status) bool {
	ao, bo := a.Code == decide.OverLimit, b.Code == decide.OverLimit
	if ao != bo {
		return ao
	}
	if ao && a.Decision.RetryAfter != b.Decision.RetryAfter {
		return a.Decision.RetryAfter > b.Decision.RetryAfter
	}
	return a.Decision.Remaining < b.Decision.Remaining
}

func appendHeaders(dst []*corev3.HeaderValue, resp *decide.Response, cfg Config) []*corev3.HeaderValue {
	var buf [6][2]string // at most six fields
	fields := appendHeaderFields(buf[:0], resp, cfg)
	if len(fields) == 0 {
		return dst
	}
	// The header values in one allocation rather than one each.
	hvs := make([]corev3.HeaderValue, len(fields))
	for i, f := range fields {
		hvs[i].Key, hvs[i].Value = f[0], f[1]
		dst = append(dst, &hvs[i])
	}
	return dst
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// appendSFString appends s as a structured field string (RFC 8941): quoted,
// with \ and " escaped and anything outside printable ASCII replaced by _.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
