package httpapi

import (
	"fmt"
	"math"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// decodeRequest reads Envoy's RateLimitRequest in protobuf's JSON from
// body, as protojson.Unmarshal does: unknown fields are errors. The common
// shape is parsed by a small scanner without reflection; anything it is
// not sure of goes to protojson, which decides and words the errors.
func decodeRequest(body []byte) (*rlsv3.RateLimitRequest, error) {
	if req, ok := decodeFast(body); ok {
		return req, nil
	}
	req := &rlsv3.RateLimitRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		return nil, fmt.Errorf("decode RateLimitRequest: %w", err)
	}
	return req, nil
}

// decodeFast parses a RateLimitRequest made of the fields Envoy's callers
// send: domain, descriptors (entries of key and value, hits_addend as a
// number, is_negative_hits) and hits_addend as a number, under their JSON
// or proto names, with strings free of escapes. It reports false for
// anything else, valid or not, including duplicate fields and nulls; what
// it accepts, protojson accepts with the same result (a fuzz test checks).
func decodeFast(b []byte) (*rlsv3.RateLimitRequest, bool) {
	s := scanner{b: b}
	req := &rlsv3.RateLimitRequest{}
	var seenDomain, seenDescs, seenHits bool
	ok := s.object(func(name string) bool {
		switch name {
		case "domain":
			if seenDomain {
				return false
			}
			seenDomain = true
			var ok bool
			req.Domain, ok = s.str()
			return ok
		case "descriptors":
			if seenDescs {
				return false
			}
			seenDescs = true
			return s.array(func() bool {
				d, ok := s.descriptor()
				req.Descriptors = append(req.Descriptors, d)
				return ok
			})
		case "hitsAddend", "hits_addend":
			if seenHits {
				return false
			}
			seenHits = true
			n, ok := s.uint(math.MaxUint32)
			req.HitsAddend = uint32(n)
			return ok
		}
		return false
	})
	s.ws()
	return req, ok && s.i == len(s.b)
}

// scanner reads JSON from b at i.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// consume skips white space and then c, reporting whether c was there.
func (s *scanner) consume(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// object reads {"name": value, ...}, calling field to read each value.
func (s *scanner) object(field func(name string) bool) bool {
	if !s.consume('{') {
		return false
	}
	if s.consume('}') {
		return true
	}
	for {
		name, ok := s.str()
		if !ok || !s.consume(':') || !field(name) {
			return false
		}
		if s.consume('}') {
			return true
		}
		if !s.consume(',') {
			return false
		}
	}
}

// array reads [value, ...], calling elem to read each value.
func (s *scanner) array(elem func() bool) bool {
	if !s.consume('[') {
		return false
	}
	if s.consume(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.consume(']') {
			return true
		}
		if !s.consume(',') {
			return false
		}
	}
}

// str reads a string without escapes or control characters, valid UTF-8.
func (s *scanner) str() (string, bool) {
	if !s.consume('"') {
		return "", false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			if !utf8.Valid(v) {
				return "", false
			}
			return string(v), true
		case c == '\\' || c < 0x20:
			return "", false
		}
		s.i++
	}
	return "", false
}

// uint reads a non-negative integer of plain digits, at most limit.
func (s *scanner) uint(limit uint64) (uint64, bool) {
	s.ws()
	start := s.i
	var n uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		d := uint64(s.b[s.i] - '0')
		if n > (limit-d)/10 {
			return 0, false
		}
		n = n*10 + d
		s.i++
	}
	digits := s.i - start
	if digits == 0 || (digits > 1 && s.b[start] == '0') {
		return 0, false
	}
	// A fraction or exponent follows: not a plain integer.
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	return n, true
}

// boolean reads true or false.
func (s *scanner) boolean() (bool, bool) {
	s.ws()
	for _, lit := range []string{"true", "false"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return lit == "true", true
		}
	}
	return false, false
}

// descriptor reads a RateLimitDescriptor.
func (s *scanner) descriptor() (*ratelimitv3.RateLimitDescriptor, bool) {
	d := &ratelimitv3.RateLimitDescriptor{}
	var seenEntries, seenHits, seenNeg bool
	ok := s.object(func(name string) bool {
		switch name {
		case "entries":
			if seenEntries {
				return false
			}
			seenEntries = true
			return s.array(func() bool {
				e, ok := s.entry()
				d.Entries = append(d.Entries, e)
				return ok
			})
		case "hitsAddend", "hits_addend":
			if seenHits {
				return false
			}
			seenHits = true
			n, ok := s.uint(math.MaxUint64)
			d.HitsAddend = wrapperspb.UInt64(n)
			return ok
		case "isNegativeHits", "is_negative_hits":
			if seenNeg {
				return false
			}
			seenNeg = true
			var ok bool
			d.IsNegativeHits, ok = s.boolean()
			return ok
		}
		return false
	})
	return d, ok
}

// entry reads a RateLimitDescriptor.Entry.
func (s *scanner) entry() (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
	e := &ratelimitv3.RateLimitDescriptor_Entry{}
	var seenKey, seenValue bool
	ok := s.object(func(name string) bool {
		var ok bool
		switch name {
		case "key":
			if seenKey {
				return false
			}
			seenKey = true
			e.Key, ok = s.str()
		case "value":
			if seenValue {
				return false
			}
			seenValue = true
			e.Value, ok = s.str()
		}
		return ok
	})
	return e, ok
}
