package decide

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Entry is one key/value pair of a descriptor, as in Envoy's
// RateLimitDescriptor.Entry.
type Entry = rules.Entry

// Descriptor is an ordered list of entries that the rules match, with the
// hits this request adds to the matched limits: rules.Descriptor.
type Descriptor = rules.Descriptor

// Request asks for a decision on the descriptors of one request in Domain.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hold says the caller calls Response.Done when the request ends (the
	// proxy and the middleware do): its concurrency slots (Config.Admit)
	// are then held until Done, or admit's HoldLease at most. Without it
	// (the decision APIs, which hear of no end) they are held for admit's
	// Lease.
	Hold bool
	// Spare, when set, reports whether the service the request goes to
	// has spare capacity now: the proxy and the middleware ask their load
	// shedder (shed.Gate.HasRoom). An elastic limit then admits a request
	// past the client's own limit only while Spare says so and the
	// domain's pool has room; it is asked only then. Nil (the decision
	// APIs, which see no service) leaves the pool alone to decide.
	Spare func() bool
}

// Code is a verdict, with Envoy's meaning.
type Code uint8

const (
	Unknown Code = iota
	OK
	OverLimit
)

// String returns the code's name in Envoy's RateLimitResponse: "UNKNOWN",
// "OK" or "OVER_LIMIT".
func (c Code) String() string {
	switch c {
	case OK:
		return "OK"
	case OverLimit:
		return "OVER_LIMIT"
	}
	return "UNKNOWN"
}

// Status is the verdict on one descriptor.
type Status struct {
	Code Code
	// Limit is the limit that decided: the one with the least remaining of
	// the descriptor's limits. Nil when no rule matched or the limit is
	// unlimited.
	Limit *rules.Limit
	// Decision is that limit's decision. When another limit of the
	// request denied, nothing was taken, and Remaining says what is left.
	Decision sluice.Decision
	// Shadow reports that the descriptor is in shadow mode: Code is OK, and
	// ShadowOverLimit says whether it would have been OVER_LIMIT.
	Shadow          bool
	ShadowOverLimit bool
	// Rule is the rule the descriptor matched, nil if none: metrics read
	// its detailed_metric and value_to_metric.
	Rule *rules.Rule
	// Concurrency reports that the rule's concurrency limit denied the
	// request: Code is OverLimit, Limit nil, and Decision's Limit is the
	// concurrency with nothing remaining.
	Concurrency bool
}

// Response is the verdict on a Request: OverLimit if any descriptor is.
type Response struct {
	Overall  Code
	Statuses []Status // one per descriptor, in order
	// Mode is ModeStore when the store decided (or nothing needed it), and
	// the fail mode's Mode when the store failed, timed out or was left
	// alone by the circuit breaker for this request.
	Mode Mode
	// UnknownDomain reports that no rules define the request's domain:
	// every status is OK with no limit.
	UnknownDomain bool

	held Holding // what the request holds until Done, or nil
}

// RetryAfter returns the longest RetryAfter of the descriptors over their
// limit, or 0.
func (r *Response) RetryAfter() time.Duration {
	var d time.Duration
	for i := range r.Statuses {
		if r.Statuses[i].Code == OverLimit {
			d = max(d, r.Statuses[i].Decision.RetryAfter)
		}
	}
	return d
}
