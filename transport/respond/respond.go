// Package respond writes sluice's verdicts on HTTP requests, for every HTTP
// way in (the forward-auth endpoint, the reverse proxy, the middleware):
// the IETF RateLimit and RateLimit-Policy fields (draft-ietf-httpapi-
// ratelimit-headers, revision 11), X-RateLimit-Limit/-Remaining/-Reset, and
// for denied requests 429 Too Many Requests with a jittered Retry-After and
// a small JSON body.
package respond

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Mode selects the rate limit fields a response carries. The zero value is
// Both.
type Mode uint8

const (
	// Both sends the IETF fields and X-RateLimit-*.
	Both Mode = iota
	// IETF sends RateLimit-Policy and RateLimit only.
	IETF
	// XRateLimit sends X-RateLimit-Limit, -Remaining and -Reset only.
	XRateLimit
	// None sends no rate limit fields; denied requests still get
	// Retry-After.
	None
)

var modeNames = [...]string{Both: "both", IETF: "ietf", XRateLimit: "x-ratelimit", None: "none"}

// String returns the mode as ParseMode reads it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode reads "ietf", "x-ratelimit", "both" or "none"; "all" and
// "ratelimit", the words of sluice serve's --response-headers, mean both
// and ietf.
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if strings.EqualFold(s, name) {
			return Mode(m), nil
		}
	}
	switch strings.ToLower(s) {
	case "all":
		return Both, nil
	case "ratelimit":
		return IETF, nil
	}
	return 0, fmt.Errorf("unknown header mode %q (want ietf, x-ratelimit, both or none)", s)
}

// UnmarshalText implements encoding.TextUnmarshaler for flags and config
// files.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Config configures a Writer.
type Config struct {
	// Mode selects the rate limit fields. Default Both.
	Mode Mode
	// RetryJitter is the most added at random to Retry-After, in whole
	// seconds, so that denied clients do not retry in lockstep. Zero means
	// no jitter. Default 1s.
	RetryJitter time.Duration
	// Rand returns a uniform random number in [0, n). Default
	// math/rand/v2's Int64N, which is safe for concurrent use; tests pass
	// their own.
	Rand func(n int64) int64
}

// DefaultConfig returns the configuration every HTTP way in uses unless
// told otherwise.
func DefaultConfig() Config {
	return Config{
		Mode:        Both,        // RateLimit, RateLimit-Policy and X-RateLimit-*
		RetryJitter: time.Second, // Retry-After is the real wait plus 0 or 1 s
		Rand:        rand.Int64N, // shared, concurrency-safe source
	}
}

// Writer writes verdicts as HTTP responses. It is immutable and safe for
// concurrent use.
type Writer struct {
	mode   Mode
	jitter int64 // whole seconds
	rand   func(int64) int64
}

// New returns a Writer for cfg; a nil Rand takes the default.
func New(cfg Config) *Writer {
	w := &Writer{mode: cfg.Mode, jitter: int64(cfg.RetryJitter / time.Second), rand: cfg.Rand}
	if w.rand == nil {
		w.rand = rand.Int64N
	}
	return w
}

// Denied reports whether resp denies the request.
func Denied(resp *decide.Response) bool { return resp != nil && resp.Overall == decide.OverLimit }

// SetHeaders sets the rate limit fields of resp in h, as the mode selects.
// Only enforced limits count: descriptors no limit matched, unlimited ones
// and those in shadow mode add nothing, so a response without an enforced
// limit gets no fields.
//
// Every enforced limit is one item of RateLimit-Policy and RateLimit, named
// by the rules file's `name` or else the limit's ID: q is its rate, w its period in seconds, r the hits remaining
// and t the seconds until it is whole again, rounded up.
// X-RateLimit-Limit/-Remaining/-Reset describe the limit that binds: on a
// denial the one with the longest retry, else the one with the least
// remaining, with Reset in seconds from now as Envoy sends it.
func (w *Writer) SetHeaders(h http.Header, resp *decide.Response) {
	if w.mode == None || resp == nil {
		return
	}
	binding := Binding(resp)
	if binding < 0 {
		return
	}
	// Every value is written into one buffer, converted to one string and
	// cut from it, and the values' slices share one array: two
	// allocations for all the fields instead of two or more each.
	var buf [256]byte
	b := buf[:0]
	var ends [5]int
	var keys [5]string
	n := 0
	cut := func(key string) { keys[n], ends[n] = key, len(b); n++ }
	if w.mode != XRateLimit {
		b = AppendPolicy(b, resp)
		cut("Ratelimit-Policy")
		b = AppendState(b, resp)
		cut("Ratelimit")
	}
	if w.mode == Both || w.mode == XRateLimit {
		st := &resp.Statuses[binding]
		b = strconv.AppendInt(b, Quota(st), 10)
		cut("X-Ratelimit-Limit")
		b = strconv.AppendInt(b, max(st.Decision.Remaining, 0), 10)
		cut("X-Ratelimit-Remaining")
		b = strconv.AppendInt(b, CeilSeconds(st.Decision.ResetAfter), 10)
		cut("X-Ratelimit-Reset")
	}
	s := string(b)
	vals := make([]string, n)
	start := 0
	for i := range n {
		vals[i] = s[start:ends[i]]
		start = ends[i]
		h[keys[i]] = vals[i : i+1 : i+1] // full: an Add to one field copies
	}
}

// enforced reports whether st counts in the rate limit fields: a limit
// matched, is not unlimited and is not in shadow mode.
func enforced(st *decide.Status) bool { return st.Limit != nil && !st.Shadow }

// Binding returns the index of the status in resp whose limit binds, the
// one X-RateLimit-* describe: on a denial the one with the longest retry,
// else the one with the least remaining. It returns -1 when no enforced
// limit applies.
func Binding(resp *decide.Response) int {
	binding := -1
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if enforced(st) && (binding < 0 || binds(st, &resp.Statuses[binding])) {
			binding = i
		}
	}
	return binding
}

// AppendPolicy appends the value of RateLimit-Policy for resp to b: one
// item per enforced limit, `"name";q=RATE;w=SECONDS`.
func AppendPolicy(b []byte, resp *decide.Response) []byte {
	return appendItems(b, resp, true)
}

// AppendState appends the value of RateLimit for resp to b: one item per
// enforced limit, `"name";r=REMAINING;t=SECONDS`.
func AppendState(b []byte, resp *decide.Response) []byte {
	return appendItems(b, resp, false)
}

// appendItems appends one structured-field item per enforced limit, named
// by the rules' `name` or else the limit's ID, with the parameters of
// RateLimit-Policy when policy, else those of RateLimit. (A flag rather
// than a func parameter, so that b does not escape to the heap.)
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
			b = strconv.AppendInt(b, Quota(st), 10)
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, CeilSeconds(st.Limit.Period()), 10)
		} else {
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, max(st.Decision.Remaining, 0), 10)
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, CeilSeconds(st.Decision.ResetAfter), 10)
		}
	}
	return b
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

// Quota returns the hits the status's limit admits per period: the rules'
// rate, as the Envoy transport reports it.
func Quota(st *decide.Status) int64 { return st.Limit.Limit.Rate }

// RetryAfter returns the Retry-After of a denied resp in whole seconds: the
// real wait rounded up, at least 1, plus a random jitter of up to the
// configured seconds, so never earlier than the limit lets the request
// pass. It reports false when no wait helps (the cost exceeds the limit).
func (w *Writer) RetryAfter(resp *decide.Response) (int64, bool) {
	d := resp.RetryAfter()
	if d == sluice.Never {
		return 0, false
	}
	s := max(CeilSeconds(d), 1)
	if w.jitter > 0 {
		s += w.rand(w.jitter + 1)
	}
	return s, true
}

// Deny writes the 429 response for a denied resp: the rate limit fields,
// Retry-After, and the body {"error":"rate limited","retry_after":N}
// (without retry_after when no wait helps).
func (w *Writer) Deny(rw http.ResponseWriter, resp *decide.Response) {
	h := rw.Header()
	w.SetHeaders(h, resp)
	body := make([]byte, 0, 64)
	body = append(body, `{"error":"rate limited"`...)
	if s, ok := w.RetryAfter(resp); ok {
		v := strconv.FormatInt(s, 10)
		h["Retry-After"] = []string{v}
		body = append(body, `,"retry_after":`...)
		body = append(body, v...)
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

// CeilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func CeilSeconds(d time.Duration) int64 {
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
