// Package respond is the one implementation of sluice's answers on HTTP,
// for every way in: the rate limit header fields (which the gRPC service
// also hands Envoy in response_headers_to_add), the 429 answer, and Guard,
// the step "descriptors from the request, decide, answer 429 or go on" that
// the forward-auth endpoint, the reverse proxy and the middleware share.
// The fields are the IETF draft's (revision 11) and X-RateLimit-*; how
// each algorithm maps onto them: docs/ways-in.md, "The rate limit header
// fields".
package respond

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Headers selects the rate limit header fields a response carries, as a
// set. The zero value means the default, AllHeaders; NoHeaders selects
// none. ParseHeaders reads the one vocabulary every way in uses (the
// --response-headers flag of sluice serve and sluice proxy).
type Headers uint8

const (
	// HeaderRateLimit selects the IETF fields RateLimit-Policy and
	// RateLimit.
	HeaderRateLimit Headers = 1 << iota
	// HeaderXRateLimit selects X-RateLimit-Limit, -Remaining and -Reset.
	HeaderXRateLimit
	// HeaderRetryAfter selects Retry-After on a denial.
	HeaderRetryAfter
	// NoHeaders selects no field: denials still get 429 and the JSON body
	// with retry_after.
	NoHeaders

	// AllHeaders selects every field.
	AllHeaders = HeaderRateLimit | HeaderXRateLimit | HeaderRetryAfter
)

var headerNames = [...]struct {
	name string
	h    Headers
}{
	{"ratelimit", HeaderRateLimit},
	{"x-ratelimit", HeaderXRateLimit},
	{"retry-after", HeaderRetryAfter},
}

// ParseHeaders reads "all", "none" (or nothing), or a comma-separated list
// of "ratelimit", "x-ratelimit" and "retry-after", in any case.
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
			return 0, fmt.Errorf("unknown response header set %q (want all, none, or a list of ratelimit, x-ratelimit, retry-after)", f)
		}
	}
	if h == 0 {
		return NoHeaders, nil
	}
	return h, nil
}

// set returns the fields h selects: the zero value is AllHeaders.
func (h Headers) set() Headers {
	switch {
	case h == 0:
		return AllHeaders
	case h&NoHeaders != 0:
		return 0
	}
	return h
}

// String returns h in the syntax ParseHeaders reads.
func (h Headers) String() string {
	h = h.set()
	switch h {
	case 0:
		return "none"
	case AllHeaders:
		return "all"
	}
	var names []string
	for _, n := range headerNames {
		if h&n.h != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// UnmarshalText implements encoding.TextUnmarshaler for flags and config
// files.
func (h *Headers) UnmarshalText(b []byte) error {
	v, err := ParseHeaders(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (h Headers) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// Config configures a Writer. The zero value is the default: every field,
// up to 1 s of jitter.
type Config struct {
	// Headers selects the fields. Zero means AllHeaders.
	Headers Headers
	// RetryJitter is the most added at random to Retry-After, in whole
	// seconds, so that denied clients do not retry in lockstep. Zero means
	// the default, 1 s; a negative value means no jitter.
	RetryJitter time.Duration
	// Rand returns a uniform random number in [0, n): the jitter's source.
	// Nil means math/rand/v2's Int64N, which is safe for concurrent use;
	// tests pass their own.
	Rand func(n int64) int64
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means.
func DefaultConfig() Config {
	return Config{
		Headers:     AllHeaders,  // the IETF draft's fields, X-RateLimit-* and Retry-After
		RetryJitter: time.Second, // denied clients do not retry in lockstep
		Rand:        rand.Int64N, // safe for concurrent use
	}
}

// Writer computes and writes the rate limit fields of verdicts. It is
// immutable and safe for concurrent use.
type Writer struct {
	headers Headers
	jitter  int64 // whole seconds
	rand    func(int64) int64
}

// New returns a Writer for cfg; zero fields take their defaults.
func New(cfg Config) *Writer {
	d := DefaultConfig()
	w := &Writer{headers: cfg.Headers.set(), rand: cfg.Rand}
	switch {
	case cfg.RetryJitter == 0:
		w.jitter = int64(d.RetryJitter / time.Second)
	case cfg.RetryJitter > 0:
		w.jitter = int64(cfg.RetryJitter / time.Second)
	}
	if w.rand == nil {
		w.rand = d.Rand
	}
	return w
}

// MaxFields is the most fields a Fields holds.
const MaxFields = 6

// Fields are the rate limit header fields of one response, computed once:
// at most MaxFields name/value pairs whose values share one string, and the
// response's retry time. The zero value has no fields and no retry time.
type Fields struct {
	n      int
	names  [MaxFields]string
	values [MaxFields]string
	retry  string // whole seconds with jitter; "" when allowed or no wait helps
}

// Len returns the number of fields.
func (f *Fields) Len() int { return f.n }

// Field returns the name and value of field i, 0 <= i < Len(), in a fixed
// order: RateLimit-Policy, RateLimit, X-RateLimit-Limit,
// X-RateLimit-Remaining, X-RateLimit-Reset, Retry-After (those selected).
func (f *Fields) Field(i int) (name, value string) { return f.names[i], f.values[i] }

// RetryAfter returns the response's Retry-After in whole seconds, the value
// of the field when it is selected, and false when the response is not a
// denial or no wait lets the request pass (its cost exceeds a limit).
func (f *Fields) RetryAfter() (string, bool) { return f.retry, f.retry != "" }

// Set sets the fields in h, replacing what h held under their names.
func (f *Fields) Set(h http.Header) {
	if f.n == 0 {
		return
	}
	vals := make([]string, f.n) // one array for all the fields' slices
	for i := range f.n {
		vals[i] = f.values[i]
		h[CanonicalKey(f.names[i])] = vals[i : i+1 : i+1] // full: an Add to one field copies
	}
}

// CanonicalKey returns http.CanonicalHeaderKey(name), without allocating
// for the names of the fields Fields computes.
func CanonicalKey(name string) string {
	switch name {
	case "RateLimit-Policy":
		return "Ratelimit-Policy"
	case "RateLimit":
		return "Ratelimit"
	case "X-RateLimit-Limit":
		return "X-Ratelimit-Limit"
	case "X-RateLimit-Remaining":
		return "X-Ratelimit-Remaining"
	case "X-RateLimit-Reset":
		return "X-Ratelimit-Reset"
	case "Retry-After":
		return "Retry-After"
	}
	return http.CanonicalHeaderKey(name)
}

// Fields computes the fields of resp as the package documentation
// describes them, drawing the jitter of its Retry-After once. Only enforced
// limits count: descriptors no limit matched, unlimited ones and those in
// shadow mode add nothing, so a response without an enforced limit gets no
// rate limit fields (a denial still gets its retry time).
func (w *Writer) Fields(resp *decide.Response) Fields {
	var f Fields
	if resp == nil {
		return f
	}
	var buf [256]byte
	b := buf[:0]
	var ends [MaxFields]int
	cut := func(name string) { f.names[f.n], ends[f.n] = name, len(b); f.n++ }
	if b0 := binding(resp); b0 >= 0 {
		if w.headers&HeaderRateLimit != 0 {
			b = appendItems(b, resp, true)
			cut("RateLimit-Policy")
			b = appendItems(b, resp, false)
			cut("RateLimit")
		}
		if w.headers&HeaderXRateLimit != 0 {
			st := &resp.Statuses[b0]
			b = strconv.AppendInt(b, quota(st), 10)
			cut("X-RateLimit-Limit")
			b = strconv.AppendInt(b, max(st.Decision.Remaining, 0), 10)
			cut("X-RateLimit-Remaining")
			b = strconv.AppendInt(b, effectiveWindow(st), 10)
			cut("X-RateLimit-Reset")
		}
	}
	retryStart := len(b)
	if s, ok := w.retryAfter(resp); ok {
		b = strconv.AppendInt(b, s, 10)
		if w.headers&HeaderRetryAfter != 0 {
			cut("Retry-After")
		}
	}
	all := string(b)
	start := 0
	for i := range f.n {
		f.values[i] = all[start:ends[i]]
		start = ends[i]
	}
	f.retry = all[retryStart:]
	return f
}

// SetHeaders sets the rate limit fields of resp in h, as Fields computes
// them.
func (w *Writer) SetHeaders(h http.Header, resp *decide.Response) {
	f := w.Fields(resp)
	f.Set(h)
}

// Deny writes the 429 response for a denied resp: the rate limit fields,
// Retry-After, and the body {"error":"rate limited","retry_after":N} with
// the same N (without retry_after when no wait helps).
func (w *Writer) Deny(rw http.ResponseWriter, resp *decide.Response) {
	f := w.Fields(resp)
	h := rw.Header()
	f.Set(h)
	body := make([]byte, 0, 64)
	body = append(body, `{"error":"rate limited"`...)
	if s, ok := f.RetryAfter(); ok {
		body = append(body, `,"retry_after":`...)
		body = append(body, s...)
	}
	body = append(body, "}\n"...)
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["Cache-Control"] = []string{"no-store"}
	rw.WriteHeader(http.StatusTooManyRequests)
	_, _ = rw.Write(body) // the client may be gone; nothing to do about it
}

// Write answers for resp: for a denial it writes the 429 response and
// returns false; otherwise it sets the rate limit fields on rw's headers,
// writes nothing else and returns true, for the caller to go on.
func (w *Writer) Write(rw http.ResponseWriter, resp *decide.Response) (allowed bool) {
	if Denied(resp) {
		w.Deny(rw, resp)
		return false
	}
	w.SetHeaders(rw.Header(), resp)
	return true
}

// Denied reports whether resp denies the request.
func Denied(resp *decide.Response) bool { return resp != nil && resp.Overall == decide.OverLimit }

// retryAfter returns the Retry-After of a denied resp in whole seconds: the
// longest retry time rounded up, at least 1, plus the jitter. It reports
// false for an allowed resp and when no wait helps.
func (w *Writer) retryAfter(resp *decide.Response) (int64, bool) {
	if !Denied(resp) {
		return 0, false
	}
	d := resp.RetryAfter()
	if d == sluice.Never {
		return 0, false
	}
	s := max(ceilSeconds(d), 1)
	if w.jitter > 0 {
		s += w.rand(w.jitter + 1)
	}
	return s, true
}

// enforced reports whether st counts in the rate limit fields: a limit
// matched, is not unlimited and is not in shadow mode.
func enforced(st *decide.Status) bool { return st.Limit != nil && !st.Shadow }

// binding returns the index of the status in resp whose limit binds, the
// one X-RateLimit-* describe: on a denial the one with the longest retry,
// else the one with the least remaining. It returns -1 when no enforced
// limit applies.
func binding(resp *decide.Response) int {
	found := -1
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if enforced(st) && (found < 0 || binds(st, &resp.Statuses[found])) {
			found = i
		}
	}
	return found
}

// binds reports whether a describes a tighter limit than b: over the
// limit before allowed, then a longer retry, then fewer remaining.
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

// appendItems appends one structured-field item per enforced limit, with
// the parameters of RateLimit-Policy (q, w) when policy, else those of
// RateLimit (r, t). (A flag rather than a func parameter, so that b does
// not escape to the heap.)
func appendItems(b []byte, resp *decide.Response, policy bool) []byte {
	first := true
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if !enforced(st) {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		name := st.Limit.Name
		if name == "" {
			name = st.Limit.ID
		}
		b = appendSFString(b, name)
		if policy {
			b = append(b, ";q="...)
			b = strconv.AppendInt(b, quota(st), 10)
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, window(st), 10)
		} else {
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, max(st.Decision.Remaining, 0), 10)
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, effectiveWindow(st), 10)
		}
	}
	return b
}

// quota returns q: what st's limit admits at once, as its decision states
// it (the nominal capacity, also under soft throttling).
func quota(st *decide.Status) int64 { return st.Decision.Limit }

// window returns w: the seconds st's limit takes to refill its quota from
// nothing, capacity × period / rate rounded up, at least 1.
func window(st *decide.Status) int64 {
	l := st.Limit.Limit
	return max(ceilSeconds(refill(quota(st), l.Rate, l.Period)), 1)
}

// refill returns capacity × period / rate, rounded up to the nanosecond,
// or the longest Duration when that is longer.
func refill(capacity, rate int64, period time.Duration) time.Duration {
	if capacity == rate || rate <= 0 || capacity <= 0 || period <= 0 {
		return period
	}
	hi, lo := bits.Mul64(uint64(capacity), uint64(period))
	if hi >= uint64(rate) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(rate))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(q)
}

// effectiveWindow returns t: for a limit the request is over, the seconds
// until a request of its cost passes; otherwise the seconds until the
// limit is whole again. Rounded up.
func effectiveWindow(st *decide.Status) int64 {
	if st.Code == decide.OverLimit && st.Decision.RetryAfter != sluice.Never {
		return ceilSeconds(st.Decision.RetryAfter)
	}
	return ceilSeconds(st.Decision.ResetAfter)
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
