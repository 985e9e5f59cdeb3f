package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Override sets the limits of one descriptor value at run time, above or
// below the rule it would match: tenant acme 500 a second where every
// tenant has 100, user bob blocked for an hour (requests_per_unit 0). An
// override is matched before the rule it overrides, for exactly its
// entries, and takes that rule's place with its own limits; the rule's
// other settings (shadow mode, metrics, share_threshold levels) stay.
//
// A limit of an override counts in the rule's counter when it has the
// same algorithm and period as a limit of the rule (its ID is the one that
// limit has for the same place), so setting, changing and removing an
// override keeps the client's count, as editing a rule does.
//
// The json tags are the form a rules database or an admin API keeps
// overrides in.
type Override struct {
	Domain string `json:"domain" yaml:"domain"`
	// Entries is the whole descriptor the override is for, each level's key
	// and value as a request sends them.
	Entries []Entry `json:"entries" yaml:"entries"`
	// Limits replace the rule's, validated as a rule's rate_limits are.
	Limits []RateLimitSpec `json:"rate_limits" yaml:"rate_limits"`
	// Expires is when the override ends by itself; the zero time never.
	Expires time.Time `json:"expires,omitzero" yaml:"expires,omitempty"`
}

// maxOverrides bounds the overrides of one Set.
const maxOverrides = 1 << 20

// WithOverrides returns a Set with the rules of s and the overrides ovs in
// force instead of those s had; s is unchanged. Overrides whose Expires is
// not after now are left out (NextExpiry says when the next one ends, for
// the caller to build the Set again then). Each override is checked as a
// rule's limits are, and must be for a descriptor that a rule of s with
// limits matches, not a share_threshold one (whose values share one
// counter), and not the same descriptor as another override; mistakes are
// returned all at once as Errors placed at overrides[i]. The Set's Version
// is a digest of s's version and the overrides in force.
func (s *Set) WithOverrides(now time.Time, ovs ...Override) (*Set, error) {
	if s == nil {
		s = &Set{}
	}
	var errs Errors
	if len(ovs) > maxOverrides {
		return nil, Errors{{Path: "overrides", Msg: fmt.Sprintf("%d overrides, more than the %d a Set holds", len(ovs), maxOverrides)}}
	}
	rp := &report{errs: &errs}
	c := &checker{rp: rp, budget: maxRules}
	out := map[string]*overrideBuilder{}
	var kept []Override
	for i := range ovs {
		o := &ovs[i]
		if rp.over {
			break
		}
		if !o.Expires.IsZero() && !o.Expires.After(now) {
			continue
		}
		ok, err := c.addOverride(s, out, o, i)
		if err != nil {
			return nil, err
		}
		if ok {
			kept = append(kept, *o)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return s.withIndexes(out, kept)
}

// addOverride checks o, the i-th override, against s's rules and adds its
// rule to its domain's builder in out, and reports whether it did; what
// is wrong with o is reported to c.
func (c *checker) addOverride(s *Set, out map[string]*overrideBuilder, o *Override, i int) (bool, error) {
	where := fmt.Sprintf("overrides[%d]", i)
	base, ok := c.overridden(s, o, where)
	if !ok {
		return false, nil
	}
	ob := out[o.Domain]
	if ob == nil {
		ob = newOverrideBuilder()
		out[o.Domain] = ob
	}
	if ob.has(o.Entries) {
		c.errorf(0, where, "a second override of %s", entriesString(o.Entries))
		return false, nil
	}
	if len(o.Limits) == 0 {
		c.errorf(0, where, "rate_limits: empty; want one or more limits")
		return false, nil
	}
	spec, err := json.Marshal(o.Limits)
	if err != nil {
		return false, fmt.Errorf("%s: %w", where, err)
	}
	key := overrideRuleKey{base: base, limits: string(spec)}
	if r, ok := ob.rule(key); ok { // the same limits for the same rule: one Rule
		ob.add(o.Entries, key, r, i, o.Expires)
		return true, nil
	}
	p := &parsedDomain{name: o.Domain, rp: c.rp, names: map[string]bool{}}
	r := *base // the overridden rule's place, settings and metric names
	r.Limits, r.Overrides, r.errPath = nil, base, "overrides"
	r.Descriptors, r.sub = nil, level{} // Match never goes below an override
	r.Limits = c.rateLimits(o.Limits, p, where)
	if len(r.Limits) != len(o.Limits) {
		return false, nil // reported
	}
	for _, l := range r.Limits {
		if len(l.Replaces) > 0 || l.Name != "" {
			c.errorf(0, where, "rate_limits: an override's limits have no name and replace nothing")
			return false, nil
		}
	}
	setIDs(&r)
	ob.add(o.Entries, key, &r, i, o.Expires)
	return true, nil
}

// withIndexes returns a copy of s whose domains have the overrides of
// out's builders, and whose Version covers kept, the overrides in force.
func (s *Set) withIndexes(out map[string]*overrideBuilder, kept []Override) (*Set, error) {
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	n := *s
	n.rulesVersion = s.RulesVersion()
	n.version = n.rulesVersion
	n.domains = make(map[string]*domain, len(s.domains))
	for name, d := range s.domains {
		nd := *d
		nd.overrides = nil
		if ob := out[name]; ob != nil && len(ob.x.recs) > 0 {
			nd.overrides = ob.index()
		}
		n.domains[name] = &nd
	}
	if len(kept) > 0 {
		h := sha256.New()
		fmt.Fprintf(h, "%s\x00", n.rulesVersion)
		h.Write(b)
		n.version = hex.EncodeToString(h.Sum(nil)[:8])
	}
	return &n, nil
}

// RulesVersion is the Version of s's rules without its overrides: the
// Version of the Set WithOverrides was first called on.
func (s *Set) RulesVersion() string {
	if s == nil {
		return ""
	}
	if s.rulesVersion != "" {
		return s.rulesVersion
	}
	return s.version
}

// overridden finds the rule that override o is for, reporting why there
// is none.
func (c *checker) overridden(s *Set, o *Override, where string) (*Rule, bool) {
	if len(o.Entries) == 0 {
		c.errorf(0, where, "entries: empty; want the descriptor to override")
		return nil, false
	}
	for _, e := range o.Entries {
		if e.Key == "" {
			c.errorf(0, where, "entries: a key must not be empty")
			return nil, false
		}
	}
	r, err := s.match(o.Domain, o.Entries)
	switch {
	case err != nil:
		c.errorf(0, where, "domain %q: %v", o.Domain, err)
		return nil, false
	case r == nil:
		c.errorf(0, where, "no rule with limits matches %s in domain %q: nothing to override", entriesString(o.Entries), o.Domain)
		return nil, false
	}
	for _, p := range r.path {
		if p.ShareThreshold {
			c.errorf(0, where, "%s matches %s, whose values share one counter (share_threshold): it cannot be overridden for one value", entriesString(o.Entries), r.Path)
			return nil, false
		}
	}
	return r, true
}

// entriesString writes entries as key=value pairs for messages.
func entriesString(entries []Entry) string {
	b := []byte{'['}
	for i, e := range entries {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%s=%q", e.Key, e.Value)
	}
	return string(append(b, ']'))
}

// OverrideRule is an override in force: the descriptor it is for and the
// rule that takes the place of the one it would match (whose Overrides is
// that rule).
type OverrideRule struct {
	Domain  string
	Entries []Entry
	Rule    *Rule
	Expires time.Time // the zero time: never
}

// Overrides returns the overrides in force in s, sorted by domain and
// entries. Their rules must not be modified.
func (s *Set) Overrides() []OverrideRule {
	if s == nil {
		return nil
	}
	var out []OverrideRule
	for _, name := range s.names {
		x := s.domains[name].overrides
		if x == nil {
			continue
		}
		for i := range x.recs {
			rec := &x.recs[i]
			out = append(out, OverrideRule{Domain: name, Entries: decodeEntries(x.keys[rec.off:rec.end]),
				Rule: x.rules[rec.rule], Expires: rec.expires})
		}
	}
	slices.SortFunc(out, func(a, b OverrideRule) int {
		if c := strings.Compare(a.Domain, b.Domain); c != 0 {
			return c
		}
		return slices.CompareFunc(a.Entries, b.Entries, func(x, y Entry) int {
			return cmp.Or(strings.Compare(x.Key, y.Key), strings.Compare(x.Value, y.Value))
		})
	})
	return out
}

// NumOverrides returns how many overrides are in force in s.
func (s *Set) NumOverrides() int {
	if s == nil {
		return 0
	}
	n := 0
	for _, d := range s.domains {
		if d.overrides != nil {
			n += len(d.overrides.recs)
		}
	}
	return n
}

// NextExpiry returns when the first override of s to expire does, or the
// zero time when none expires.
func (s *Set) NextExpiry() time.Time {
	var next time.Time
	if s == nil {
		return next
	}
	for _, d := range s.domains {
		if d.overrides == nil {
			continue
		}
		for i := range d.overrides.recs {
			e := d.overrides.recs[i].expires
			if !e.IsZero() && (next.IsZero() || e.Before(next)) {
				next = e
			}
		}
	}
	return next
}
