package rules

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice"
)

// Descriptor is one descriptor of a request: an ordered list of entries
// that the rules match, with the hits the request adds to the matched
// limits. Transports and package identity make them; package decide
// decides them.
type Descriptor struct {
	Entries []Entry
	// Cost is the hits the request adds: 0 checks without counting. The
	// transport resolves Envoy's defaults (an unset hits_addend is 1).
	Cost int64
	// Limit, when not nil, is the descriptor's own limit (Envoy's
	// RateLimitDescriptor.limit), which takes the place of the rules' for
	// it in a domain the rules define (RequestRule).
	Limit *RequestLimit
}

// RequestLimit is a limit that a request sets for one of its descriptors:
// Envoy's RateLimitDescriptor.limit, which Envoy's rate limit filter fills
// from dynamic metadata. It takes the place of whatever the rules say of
// the descriptor (see RequestRule).
type RequestLimit struct {
	// RequestsPerUnit is the number of hits a window admits; 0 denies
	// every request, as requests_per_unit: 0 does in a rules file.
	RequestsPerUnit int64
	// Unit is the window, one of the rules file's units in lower case:
	// second, minute, hour, day, week, month or year.
	Unit string
}

// RequestRule returns the rule that decides a descriptor of domain with
// the given entries that carries its own limit rl, as Envoy's ratelimit
// decides it: matched is the rule Match returned for the descriptor (nil
// when none matched; the domain must be one the rules define), and the
// returned rule has one limit, rl counted in a fixed window aligned to its
// unit, in neither shadow nor quota mode, without a name, replaces or
// metadata, whatever matched says. It replaces matched's rate limits only:
// matched's concurrency limit and priority (sluice's, which Envoy's
// ratelimit has not) stay, as do its metric names.
//
// The limit counts where a fixed_window limit with rl's period would count
// in matched (its ID is the one setIDs gives the first such limit), so
// that a request limit with the same unit as the rules' limit shares its
// count, and changing RequestsPerUnit keeps the count, as in Envoy's
// ratelimit, whose counter key holds neither the rate nor where the limit
// came from. Unlike matched's own limits it counts every value on its own
// even where matched shares a threshold (Envoy builds a request limit
// without share_threshold). With no matched rule, the levels are the
// entries' keys without values, so metrics name the keys, not the values.
//
// RequestRule allocates the rule; it returns an error for a unit it does
// not know or a limit sluice.Limit.Validate refuses.
func RequestRule(domain string, matched *Rule, entries []Entry, rl RequestLimit) (*Rule, error) {
	unit := strings.ToLower(rl.Unit)
	period, ok := unitPeriod(unit)
	if !ok {
		return nil, fmt.Errorf("unit: unknown unit %q (want %s)", rl.Unit, unitNames)
	}
	// The rule, its limit and its list of limits in one allocation.
	a := &struct {
		r  Rule
		l  Limit
		ls [1]*Limit
	}{}
	r, l := &a.r, &a.l
	*l = Limit{Unit: unit, UnitMultiplier: 1, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Period: period}}
	switch {
	case rl.RequestsPerUnit < 0:
		return nil, fmt.Errorf("requests_per_unit: must be at least 0, got %d", rl.RequestsPerUnit)
	case rl.RequestsPerUnit == 0:
		l.Block = true
	default:
		l.Limit.Rate = rl.RequestsPerUnit
		if err := l.Limit.Validate(); err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
	}

	if matched != nil {
		*r = *matched
		r.path = unshared(matched.path)
	} else {
		*r = Rule{Domain: domain, Path: domain, depth: len(entries) - 1}
		levels := make([]Rule, len(entries))
		r.path = make([]*Rule, len(entries))
		for i, e := range entries {
			levels[i] = Rule{Domain: domain, Key: e.Key, depth: i}
			r.path[i] = &levels[i]
			r.Path += "." + e.Key
		}
		if len(entries) > 0 {
			r.Key = entries[len(entries)-1].Key
		}
	}
	a.ls[0] = l
	r.Limits = a.ls[:]
	r.ShadowMode, r.QuotaMode, r.Metadata, r.ShareThreshold = false, false, nil, false
	r.Descriptors, r.sub, r.Overrides = nil, level{}, nil
	if matched != nil {
		// The first fixed window of this period in matched has the ID
		// setIDs would give l there: take it rather than derive it again.
		for _, ml := range matched.Limits {
			if !ml.Unlimited && ml.Limit.Algorithm == sluice.FixedWindow && ml.Limit.Period == period {
				l.ID, l.Sync = ml.ID, ml.Sync // one counter is kept one way
				break
			}
		}
	}
	if l.ID == "" {
		l.ID = limitID(r, l, 0)
	}
	return r, nil
}

// unshared returns path, or a copy of it whose levels that share a
// threshold are copies that do not.
func unshared(path []*Rule) []*Rule {
	shared := false
	for _, p := range path {
		shared = shared || p.ShareThreshold
	}
	if !shared {
		return path
	}
	out := make([]*Rule, len(path))
	for i, p := range path {
		out[i] = p
		if p.ShareThreshold {
			c := *p
			c.ShareThreshold = false
			out[i] = &c
		}
	}
	return out
}
