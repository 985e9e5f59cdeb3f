// Package rules reads sluice's rules files: Envoy ratelimit's descriptor
// format plus sluice's extensions (see shared/DESIGN.md), strictly decoded
// and validated with file:line errors, and matches request descriptors to
// their limits.
package rules

import "errors"

// ErrUnknownDomain is returned by Match for a domain no rules file defines.
var ErrUnknownDomain = errors.New("unknown domain")

// Entry is one key/value pair of a request's descriptor.
type Entry struct {
	Key   string
	Value string
}

// Rule is one descriptor of a rules file: a key, an optional value (which
// may hold * wildcards), the limits it sets and the descriptors nested in it.
type Rule struct {
	Key   string
	Value string // "" matches any value, each value counted on its own
	// Limits are the limits of this descriptor (rate_limit, or several in
	// rate_limits); a request passes only if all pass. Empty when the
	// descriptor only nests others.
	Limits         []*Limit
	ShadowMode     bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	Descriptors    []*Rule
	// File and Line locate the descriptor in its rules file.
	File string
	Line int
}
