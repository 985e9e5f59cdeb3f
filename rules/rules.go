// Package rules reads sluice's rules files: Envoy ratelimit's descriptor
// format plus sluice's extensions (see shared/DESIGN.md), strictly decoded
// and validated with file:line errors, and matches request descriptors to
// their limits.
//
// Load reads a file or a directory into an immutable Set, and NewSet builds
// one from Go values (DomainSpec, the schema of a rules document) with the
// same validation: yaml.go is the YAML plumbing, schema.go the schema and
// its checks that every source goes through. Set.Match finds the rule of a
// descriptor with Envoy's semantics; a Watcher reloads the rules when their
// files change and keeps the last good Set in force.
package rules

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice"
)

// ErrUnknownDomain is returned by Match for a domain no rules file defines.
var ErrUnknownDomain = errors.New("unknown domain")

// Entry is one key/value pair of a request's descriptor.
type Entry = sluice.Entry

// Rule is one descriptor of a rules file: a key, an optional value (which
// may hold * wildcards), the limits it sets and the descriptors nested in it.
// A Rule belongs to an immutable Set and is never modified; it is safe for
// concurrent use.
type Rule struct {
	Key   string
	Value string // "" matches any value, each value counted on its own
	// Limits are the limits of this descriptor (rate_limit, or several in
	// rate_limits); a request passes only if all pass. Empty when the
	// descriptor only nests others.
	Limits []*Limit
	// ShadowMode is Envoy's shadow_mode: the limits are taken and counted,
	// but the answer is always OK.
	ShadowMode bool
	// QuotaMode is Envoy's quota_mode: a request over this descriptor's
	// limit is denied only if every quota-mode descriptor of the request is
	// over its limit (and no other descriptor denies it).
	QuotaMode bool
	// Metadata is Envoy's metadata of the descriptor, JSON-like data (see
	// DescriptorSpec) that Envoy's ratelimit returns in a response's
	// dynamic metadata; nil when the rules state none. It must not be
	// modified.
	Metadata map[string]any
	// DetailedMetric is Envoy's detailed_metric: metrics of this
	// descriptor name the request's values at every level (see
	// AppendMetricKey).
	DetailedMetric bool
	// ValueToMetric is Envoy's value_to_metric: metrics name the request's
	// value at this level even when the rule has no value or a wildcard.
	ValueToMetric bool
	// ShareThreshold is Envoy's share_threshold, only on a wildcard value:
	// every value matching the pattern shares one counter instead of one
	// counter per value (see AppendKey).
	ShareThreshold bool
	Descriptors    []*Rule
	// Concurrency is sluice's `concurrency`: at most this many requests
	// matching the descriptor in flight at once, counted per value as its
	// limits are (per client, per route, or one count for the whole
	// descriptor); 0 for none. At most MaxConcurrency.
	Concurrency int64
	// ConcurrencyID identifies the concurrency count in store keys, as a
	// Limit's ID does its counter; empty without Concurrency.
	ConcurrencyID string
	// Priority is sluice's `priority`: PriorityCritical, PriorityDefault
	// or PrioritySheddable, the order in which load shedding spares the
	// descriptor's requests; "" when the rules state none, and the rule
	// then takes no part in a request's priority.
	Priority string
	// File and Line locate the descriptor in its rules file.
	File string
	Line int
	// Domain is the domain of the rules file the descriptor is in.
	Domain string
	// Path is the descriptor's full name as Envoy's ratelimit writes it in
	// stats: the domain and, for each level, key or key_value, joined by
	// dots ("messaging.message_type_marketing.to_number").
	Path string
	// Overrides is, for the rule of an Override, the rule it takes the place
	// of, whose Key, Value, settings, File, Line and Path it shares; nil
	// for a rule of the rules.
	Overrides *Rule

	errPath string  // the rule's Error.Path
	depth   int     // 0 at the top level
	path    []*Rule // the rules from the top level down to this one
	glob    glob    // the compiled Value when it holds a *
	sub     level   // lookup tables of Descriptors
}

// Depth returns how many entries a descriptor needs to land on r: 1 for a
// top-level rule.
func (r *Rule) Depth() int { return r.depth + 1 }

// Wildcard reports whether r's value holds a * wildcard.
func (r *Rule) Wildcard() bool { return r.glob.parts != nil }

// Fixed reports whether level i (from 0, the top) of the way to r matches
// one value only (a value without a wildcard, as path=/login): the
// entries there are the same for every client of r, so they name no
// client. False for i beyond r's depth.
func (r *Rule) Fixed(i int) bool {
	return i >= 0 && i < len(r.path) && r.path[i].Value != "" && !r.path[i].Wildcard()
}

// AppendKey appends to dst the store key of limit l of r for a descriptor's
// entries that Match resolved to r, and returns the extended slice. The key
// is l.ID followed by the entries' values, each length-prefixed so that no
// two descriptors share a key by accident; a level with share_threshold
// contributes its pattern instead of the value, so every matching value
// counts against one counter. AppendKey allocates nothing when dst has room.
func (r *Rule) AppendKey(dst []byte, l *Limit, entries []Entry) []byte {
	dst = append(dst, l.ID...)
	for i := range entries {
		if i < len(r.path) && r.path[i].ShareThreshold {
			dst = append(dst, "|*"...)
			continue
		}
		dst = append(dst, '|')
		dst = strconv.AppendInt(dst, int64(len(entries[i].Value)), 10)
		dst = append(dst, ':')
		dst = append(dst, entries[i].Value...)
	}
	return dst
}

// AppendMetricKey appends to dst the name under which a descriptor that
// Match resolved to r is counted in metrics, as Envoy's ratelimit names its
// stats: the domain, then each level as written in the rules file (key,
// key_value or key_pattern), joined by dots. With detailed_metric on r every
// level names the request's value instead, and value_to_metric on a level
// names the request's value at that level. It allocates nothing when dst has
// room.
func (r *Rule) AppendMetricKey(dst []byte, entries []Entry) []byte {
	return r.appendMetric(dst, entries, true)
}

// MetricValues reports whether AppendMetricKey names a request's values
// under r: detailed_metric on r, or value_to_metric on a level of its path.
// Such names are as many as the values clients send.
func (r *Rule) MetricValues() bool {
	if r.DetailedMetric {
		return true
	}
	for _, p := range r.path {
		if p.ValueToMetric {
			return true
		}
	}
	return false
}

// AppendMetricName appends to dst the name AppendMetricKey gives a
// descriptor without the request's values, whatever detailed_metric and
// value_to_metric say: each level as written in the rules file.
func (r *Rule) AppendMetricName(dst []byte, entries []Entry) []byte {
	return r.appendMetric(dst, entries, false)
}

// appendMetric is AppendMetricKey, with the request's values where the
// rules ask for them only when values is set.
func (r *Rule) appendMetric(dst []byte, entries []Entry, values bool) []byte {
	dst = append(dst, r.Domain...)
	for i := range entries {
		dst = append(dst, '.')
		dst = append(dst, entries[i].Key...)
		v := entries[i].Value
		if !values || !r.DetailedMetric && i < len(r.path) && !r.path[i].ValueToMetric {
			v = ""
			if i < len(r.path) {
				v = r.path[i].Value
			}
		}
		if v != "" {
			dst = append(dst, '_')
			dst = append(dst, v...)
		}
	}
	return dst
}
