package envoyrls

import (
	"fmt"
	"math"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

// RequestError is a request that Envoy's API can express and sluice cannot
// decide on: negative hits, or a hits_addend beyond 2^32-1. The gRPC
// service answers it with InvalidArgument, the HTTP API with 400. Requests
// without a domain, descriptors, entries or keys are the decision service's
// to reject (decide.ErrInvalidRequest), so that every transport reports and
// counts them alike.
type RequestError struct {
	Field  string // the offending field, such as "descriptors[1].hits_addend"
	Reason string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Reason }

// Decode converts Envoy's RateLimitRequest into a decide.Request, resolving
// the hits to add the way Envoy's ratelimit service does: a descriptor's
// hits_addend, when present, wins (an explicit 0 checks without counting);
// otherwise the request's hits_addend applies, where 0 means unset and
// therefore 1. Descriptors and entries keep their order. A descriptor's
// limit (RateLimitDescriptor.limit, the override Envoy's filter sends)
// becomes its decide.Descriptor.Limit, which takes the place of the rules'.
//
// A descriptor with is_negative_hits asks to give hits back, which no store
// does: it is checked without counting (cost 0), where Envoy's ratelimit,
// which ignores the flag, would count its hits. What decide cannot express
// is reported as a *RequestError: a descriptor's hits_addend above 2^32-1,
// the range of the request's, and a limit whose unit is UNKNOWN or not one
// of Envoy's (Envoy's ratelimit cannot answer those either).
func Decode(req *rlsv3.RateLimitRequest) (*decide.Request, error) {
	descs := req.GetDescriptors()
	cost := int64(req.GetHitsAddend())
	if cost == 0 {
		cost = 1
	}
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	// One backing array for all entries: three allocations per request.
	entries := make([]decide.Entry, 0, n)
	out := &decide.Request{Domain: req.GetDomain(), Descriptors: make([]decide.Descriptor, len(descs))}
	for i, d := range descs {
		start := len(entries)
		for _, e := range d.GetEntries() {
			entries = append(entries, decide.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		c := cost
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > math.MaxUint32 {
				return nil, &RequestError{fmt.Sprintf("descriptors[%d].hits_addend", i), fmt.Sprintf("%d is too large", h.GetValue())}
			}
			c = int64(h.GetValue())
		}
		if d.GetIsNegativeHits() {
			c = 0
		}
		out.Descriptors[i] = decide.Descriptor{Entries: entries[start:len(entries):len(entries)], Cost: c}
		if o := d.GetLimit(); o != nil {
			name := unitName(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()))
			if name == "" {
				return nil, &RequestError{fmt.Sprintf("descriptors[%d].limit.unit", i), fmt.Sprintf("%s is not a unit of Envoy's", o.GetUnit())}
			}
			out.Descriptors[i].Limit = &rules.RequestLimit{RequestsPerUnit: int64(o.GetRequestsPerUnit()), Unit: name}
		}
	}
	return out, nil
}

// unitName returns the rules file's name of Envoy's unit u (whose numbers
// are those of envoy.type.v3.RateLimitUnit, the unit of a descriptor's
// limit), or "" for UNKNOWN and numbers Envoy does not define.
func unitName(u rlsv3.RateLimitResponse_RateLimit_Unit) string {
	for _, x := range units {
		if x.unit == u {
			return x.name
		}
	}
	return ""
}

// Encode converts a decision into Envoy's RateLimitResponse with one status
// per descriptor and the rate limit headers w computes (package respond:
// the same fields, with the same meaning, as the HTTP ways in send), which
// Envoy adds to the client's response (response_headers_to_add). A nil w
// adds none.
//
// A status's current_limit carries the rules file's name, rate and unit. A
// window Envoy's unit enum cannot express alone, such as 5 minutes, is sent
// as unit MINUTE with unit_multiplier 5 (a field of Envoy's API that older
// Envoys ignore); a limit whose unit is unknown is expressed in the largest
// of second, minute, hour and day that divides its period. For the bucket
// algorithms requests_per_unit is the sustained rate, not the burst.
// limit_remaining saturates at 2^32-1, and duration_until_reset is the time
// until the limit is whole again. A descriptor whose rule is unlimited has
// no current_limit and limit_remaining 2^32-1, as Envoy's ratelimit sends.
//
// A decision the store did not make (resp.Mode not decide.ModeStore)
// carries dynamic_metadata {"sluice_mode": mode} (fail_open, fail_closed,
// local or slow), which Envoy's rate limit filter puts under its namespace
// envoy.filters.http.ratelimit for access logs; a decision of the store
// carries none, as Envoy's ratelimit sends none.
func Encode(resp *decide.Response, w *respond.Writer) *rlsv3.RateLimitResponse {
	var out *rlsv3.RateLimitResponse
	if len(resp.Statuses) == 1 {
		out = encodeOne(resp, w)
	} else {
		out = encodeMany(resp, w)
	}
	if resp.Mode != decide.ModeStore {
		out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			ModeKey: structpb.NewStringValue(resp.Mode.String()),
		}}
	}
	return out
}

// ModeKey is the key of dynamic_metadata under which a response says the
// fail mode that decided it (see Encode).
const ModeKey = "sluice_mode"

// encodeMany is Encode for any number of statuses.
func encodeMany(resp *decide.Response, w *respond.Writer) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{
		OverallCode: code(resp.Overall),
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(resp.Statuses)),
	}
	// The statuses in one allocation rather than one each.
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(resp.Statuses))
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		ds := &statuses[i]
		ds.Code = code(st.Code)
		if st.Limit != nil {
			ds.CurrentLimit = currentLimit(st.Limit)
			ds.LimitRemaining = saturate32(st.Decision.Remaining)
			ds.DurationUntilReset = durationpb.New(st.Decision.ResetAfter)
		} else if unlimited(st) {
			ds.LimitRemaining = math.MaxUint32
		}
		out.Statuses[i] = ds
	}
	if w != nil {
		f := w.Fields(resp)
		if f.Len() > 0 {
			// The header values and their pointers in one allocation each.
			hvs := make([]corev3.HeaderValue, f.Len())
			out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, f.Len())
			for i := range f.Len() {
				hvs[i].Key, hvs[i].Value = f.Field(i)
				out.ResponseHeadersToAdd[i] = &hvs[i]
			}
		}
	}
	return out
}

// oneAnswer is every message of the answer to a request with one
// descriptor, the common case, allocated at once.
type oneAnswer struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	reset    durationpb.Duration
	headers  [respond.MaxFields]*corev3.HeaderValue
	values   [respond.MaxFields]corev3.HeaderValue
}

// encodeOne is Encode for a response with one status, in two allocations:
// the messages and the headers' values.
func encodeOne(resp *decide.Response, w *respond.Writer) *rlsv3.RateLimitResponse {
	a := &oneAnswer{}
	st := &resp.Statuses[0]
	a.resp.OverallCode = code(resp.Overall)
	a.status.Code = code(st.Code)
	if st.Limit != nil {
		unit, mult := unitOf(st.Limit)
		a.limit.Name, a.limit.RequestsPerUnit, a.limit.Unit = st.Limit.Name, saturate32(st.Limit.Limit.Rate), unit
		if mult > 1 {
			a.limit.UnitMultiplier = wrapperspb.UInt32(saturate32(mult))
		}
		a.status.CurrentLimit = &a.limit
		a.status.LimitRemaining = saturate32(st.Decision.Remaining)
		d := st.Decision.ResetAfter
		a.reset.Seconds, a.reset.Nanos = int64(d/time.Second), int32(d%time.Second)
		a.status.DurationUntilReset = &a.reset
	} else if unlimited(st) {
		a.status.LimitRemaining = math.MaxUint32
	}
	a.statuses[0] = &a.status
	a.resp.Statuses = a.statuses[:]
	if w != nil {
		f := w.Fields(resp)
		for i := range f.Len() {
			a.values[i].Key, a.values[i].Value = f.Field(i)
			a.headers[i] = &a.values[i]
		}
		if f.Len() > 0 {
			a.resp.ResponseHeadersToAdd = a.headers[:f.Len()]
		}
	}
	return &a.resp
}

// unlimited reports whether st is the status of a descriptor whose rule is
// unlimited (Envoy's unlimited: true).
func unlimited(st *decide.Status) bool {
	return st.Rule != nil && len(st.Rule.Limits) == 1 && st.Rule.Limits[0].Unlimited
}

func code(c decide.Code) rlsv3.RateLimitResponse_Code {
	switch c {
	case decide.OK:
		return rlsv3.RateLimitResponse_OK
	case decide.OverLimit:
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_UNKNOWN
}

func saturate32(n int64) uint32 {
	switch {
	case n <= 0:
		return 0
	case n > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(n)
}

// units are Envoy's units with their lengths; month is 30 days and year 365
// days, as in the rules package.
var units = []struct {
	name string
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{"second", rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	{"minute", rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{"hour", rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{"day", rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{"week", rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{"month", rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	{"year", rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// unitOf returns Envoy's unit and multiplier for l: the rules file's unit
// when it names one of Envoy's, else the largest of second..day dividing the
// period. Sub-second periods have no Envoy unit: UNKNOWN, multiplier 0.
func unitOf(l *rules.Limit) (rlsv3.RateLimitResponse_RateLimit_Unit, int64) {
	for _, u := range units {
		if strings.EqualFold(l.Unit, u.name) {
			return u.unit, max(l.UnitMultiplier, 1)
		}
	}
	p := l.Period()
	for i := 3; i >= 0; i-- {
		if u := units[i]; p >= u.d && p%u.d == 0 {
			return u.unit, int64(p / u.d)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}

func currentLimit(l *rules.Limit) *rlsv3.RateLimitResponse_RateLimit {
	unit, mult := unitOf(l)
	rl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: saturate32(l.Limit.Rate),
		Unit:            unit,
	}
	if mult > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(saturate32(mult))
	}
	return rl
}
