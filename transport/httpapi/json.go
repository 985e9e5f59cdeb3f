package httpapi

import (
	"strconv"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// appendResponse appends r in protobuf's canonical JSON, compact, the
// bytes protojson.Marshal writes for it with its whitespace removed. It
// encodes the fields sluice fills in (overall code, statuses with their
// limits, remaining and reset, and response headers) without reflection,
// several times faster than protojson; for a response with any other field
// set, or a string that is not valid UTF-8, it reports false and the
// caller uses protojson.
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) ([]byte, bool) {
	if len(r.GetRequestHeadersToAdd()) > 0 || len(r.GetRawBody()) > 0 || r.GetDynamicMetadata() != nil || r.GetQuota() != nil {
		return b, false
	}
	b = append(b, '{')
	n := 0 // fields written
	field := func(name string) { b = appendKey(b, &n, name) }
	if c := r.GetOverallCode(); c != 0 {
		field("overallCode")
		b = appendEnum(b, int32(c), rlsv3.RateLimitResponse_Code_name)
	}
	if sts := r.GetStatuses(); len(sts) > 0 {
		field("statuses")
		b = append(b, '[')
		for i, st := range sts {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendStatus(b, st); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	if hs := r.GetResponseHeadersToAdd(); len(hs) > 0 {
		field("responseHeadersToAdd")
		b = append(b, '[')
		for i, h := range hs {
			if len(h.GetRawValue()) > 0 || !utf8.ValidString(h.GetKey()) || !utf8.ValidString(h.GetValue()) {
				return b, false
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			hn := 0
			if h.GetKey() != "" {
				b = append(b, `"key":`...)
				b = appendString(b, h.GetKey())
				hn++
			}
			if h.GetValue() != "" {
				if hn > 0 {
					b = append(b, ',')
				}
				b = append(b, `"value":`...)
				b = appendString(b, h.GetValue())
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

// appendStatus appends one DescriptorStatus; false for a field it does not
// know.
func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) ([]byte, bool) {
	if st.GetQuota() != nil {
		return b, false
	}
	b = append(b, '{')
	n := 0
	field := func(name string) { b = appendKey(b, &n, name) }
	if c := st.GetCode(); c != 0 {
		field("code")
		b = appendEnum(b, int32(c), rlsv3.RateLimitResponse_Code_name)
	}
	if l := st.GetCurrentLimit(); l != nil {
		if !utf8.ValidString(l.GetName()) {
			return b, false
		}
		field("currentLimit")
		b = append(b, '{')
		ln := 0
		lfield := func(name string) { b = appendKey(b, &ln, name) }
		if l.GetName() != "" {
			lfield("name")
			b = appendString(b, l.GetName())
		}
		if v := l.GetRequestsPerUnit(); v != 0 {
			lfield("requestsPerUnit")
			b = strconv.AppendUint(b, uint64(v), 10)
		}
		if u := l.GetUnit(); u != 0 {
			lfield("unit")
			b = appendEnum(b, int32(u), rlsv3.RateLimitResponse_RateLimit_Unit_name)
		}
		if m := l.GetUnitMultiplier(); m != nil {
			lfield("unitMultiplier")
			b = strconv.AppendUint(b, uint64(m.GetValue()), 10)
		}
		b = append(b, '}')
	}
	if v := st.GetLimitRemaining(); v != 0 {
		field("limitRemaining")
		b = strconv.AppendUint(b, uint64(v), 10)
	}
	if d := st.GetDurationUntilReset(); d != nil {
		var ok bool
		field("durationUntilReset")
		if b, ok = appendDuration(b, d); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendEnum appends an enum value by name, or by number when it has none,
// as protojson does.
func appendEnum(b []byte, v int32, names map[int32]string) []byte {
	if name, ok := names[v]; ok {
		b = append(b, '"')
		b = append(b, name...)
		return append(b, '"')
	}
	return strconv.AppendInt(b, int64(v), 10)
}

// appendDuration appends d as protojson does: seconds with 0, 3, 6 or 9
// fractional digits and an "s", such as "1.500s". False for a duration
// protojson rejects (out of range, or seconds and nanos of opposite signs).
func appendDuration(b []byte, d *durationpb.Duration) ([]byte, bool) {
	const maxSeconds = 315576000000
	secs, nanos := d.GetSeconds(), d.GetNanos()
	if secs < -maxSeconds || secs > maxSeconds || nanos <= -1e9 || nanos >= 1e9 ||
		(secs > 0 && nanos < 0) || (secs < 0 && nanos > 0) {
		return b, false
	}
	b = append(b, '"')
	if secs < 0 || nanos < 0 {
		b = append(b, '-')
		secs, nanos = -secs, -nanos
	}
	b = strconv.AppendInt(b, secs, 10)
	if nanos != 0 {
		var frac [9]byte
		for i, v := 8, nanos; i >= 0; i-- {
			frac[i] = byte('0' + v%10)
			v /= 10
		}
		digits := 9
		switch {
		case nanos%1e6 == 0:
			digits = 3
		case nanos%1e3 == 0:
			digits = 6
		}
		b = append(b, '.')
		b = append(b, frac[:digits]...)
	}
	return append(b, 's', '"'), true
}

// appendString appends s, valid UTF-8, as a JSON string escaped as
// protojson escapes it: ", \ and control characters only.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendKey appends an object member's name and colon to b, after a comma
// unless it is the object's first (*n counts the members written).
func appendKey(b []byte, n *int, name string) []byte {
	if *n > 0 {
		b = append(b, ',')
	}
	*n++
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}
