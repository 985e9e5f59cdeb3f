package rules

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Set is every domain of a set of rules files. A Set is immutable once
// loaded and safe for concurrent use; a reload builds a new one. The zero
// Set, like a nil *Set, has no domains.
type Set struct {
	domains map[string]*domain
	names   []string // sorted
	version string
	// rulesVersion is the version of the rules alone once WithOverrides
	// made the Set; "" before, when version is that.
	rulesVersion string
	origin       *Origin // WithOrigin's; nil: none said
}

// domain is one domain of a Set with the lookup tables of its top level.
type domain struct {
	name     string
	file     string
	line     int
	capacity *Limit // the pool of its elastic limits; nil if none
	rules    []*Rule
	root     level
	// overrides are the overrides in force in the domain (WithOverrides);
	// nil for none.
	overrides *overrideIndex
}

// level holds the lookup tables of one list of descriptors, so that Match
// finds a rule with a few map lookups.
type level struct {
	exact map[Entry]*Rule    // descriptors with a plain value
	globs map[string][]*Rule // descriptors with a wildcard value, by key, in file order
	key   map[string]*Rule   // descriptors with a key and no value
}

// index builds lv's tables for rules and, recursively, theirs.
func (lv *level) index(rules []*Rule) {
	for _, r := range rules {
		switch {
		case r.Wildcard():
			if lv.globs == nil {
				lv.globs = map[string][]*Rule{}
			}
			lv.globs[r.Key] = append(lv.globs[r.Key], r)
		case r.Value != "":
			if lv.exact == nil {
				lv.exact = map[Entry]*Rule{}
			}
			lv.exact[Entry{Key: r.Key, Value: r.Value}] = r
		default:
			if lv.key == nil {
				lv.key = map[string]*Rule{}
			}
			lv.key[r.Key] = r
		}
		r.sub.index(r.Descriptors)
	}
}

// lookup returns the rule of lv that e lands on, Envoy's way: the exact key
// and value first, then the first wildcard value, in file order, that
// matches, then the key alone.
func (lv *level) lookup(e Entry) *Rule {
	if r, ok := lv.exact[e]; ok {
		return r
	}
	for _, r := range lv.globs[e.Key] {
		if r.glob.match(e.Value) {
			return r
		}
	}
	return lv.key[e.Key]
}

// Match returns the rule whose limits apply to a request's descriptor in
// domain, with the semantics of Envoy's ratelimit: the entries are matched
// level by level, each one to the exact key and value if the rules have it,
// else to the first wildcard value that matches, else to the key alone; the
// descriptor is limited when its last entry lands on a rule with limits, a
// concurrency, or a priority other than default.
// Match returns nil when no rule applies (the descriptor is not limited) and
// ErrUnknownDomain, unwrapped, when no rules file defines domain. Match
// allocates nothing. An override (WithOverrides) for exactly entries comes
// first: Match returns its rule, which takes the place of the rule the
// descriptor would match.
func (s *Set) Match(domain string, entries []Entry) (*Rule, error) {
	if s == nil {
		return nil, ErrUnknownDomain
	}
	d := s.domains[domain]
	if d == nil {
		return nil, ErrUnknownDomain
	}
	if d.overrides != nil {
		if r := d.overrides.lookup(entries); r != nil {
			return r, nil
		}
	}
	return d.match(entries)
}

// match is Match without overrides.
func (s *Set) match(domain string, entries []Entry) (*Rule, error) {
	if s == nil {
		return nil, ErrUnknownDomain
	}
	d := s.domains[domain]
	if d == nil {
		return nil, ErrUnknownDomain
	}
	return d.match(entries)
}

// match is Match in d, without overrides.
func (d *domain) match(entries []Entry) (*Rule, error) {
	lv := &d.root
	for i := range entries {
		r := lv.lookup(entries[i])
		switch {
		case r == nil:
			return nil, nil
		case i == len(entries)-1:
			if len(r.Limits) == 0 && r.Concurrency == 0 && r.Priority == "" {
				return nil, nil // nothing applies at this level
			}
			return r, nil
		case len(r.Descriptors) == 0:
			return nil, nil // the descriptor is deeper than the rules
		}
		lv = &r.sub
	}
	return nil, nil
}

// Domains returns the names of the Set's domains, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.names)
}

// Rules returns the top-level descriptors of domain in file order, or nil
// for an unknown domain. The rules must not be modified.
func (s *Set) Rules(domain string) []*Rule {
	if s == nil || s.domains[domain] == nil {
		return nil
	}
	return s.domains[domain].rules
}

// Version identifies the contents of the rules files the Set was loaded
// from (a digest of their names and bytes): equal versions, equal rules.
func (s *Set) Version() string {
	if s == nil {
		return ""
	}
	return s.version
}

// ruleJSON is how a Rule shows in the rules in force.
type ruleJSON struct {
	Key            string         `json:"key"`
	Value          string         `json:"value,omitempty"`
	Path           string         `json:"path"`
	Line           int            `json:"line"`
	Limits         []*Limit       `json:"limits,omitempty"`
	ShadowMode     bool           `json:"shadow_mode,omitempty"`
	QuotaMode      bool           `json:"quota_mode,omitempty"`
	Metadata       map[string]any `json:"metadata,omitempty"`
	DetailedMetric bool           `json:"detailed_metric,omitempty"`
	ValueToMetric  bool           `json:"value_to_metric,omitempty"`
	ShareThreshold bool           `json:"share_threshold,omitempty"`
	Concurrency    int64          `json:"concurrency,omitempty"`
	Priority       string         `json:"priority,omitempty"`
	Descriptors    []ruleJSON     `json:"descriptors,omitempty"`
}

type domainJSON struct {
	Domain      string     `json:"domain"`
	File        string     `json:"file"`
	Line        int        `json:"line"`
	Capacity    *Limit     `json:"capacity,omitempty"`
	Descriptors []ruleJSON `json:"descriptors"`
}

func rulesJSON(rules []*Rule) []ruleJSON {
	out := make([]ruleJSON, len(rules))
	for i, r := range rules {
		out[i] = ruleJSON{
			Key: r.Key, Value: r.Value, Path: r.Path, Line: r.Line, Limits: r.Limits,
			ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode, Metadata: r.Metadata, DetailedMetric: r.DetailedMetric,
			ValueToMetric: r.ValueToMetric, ShareThreshold: r.ShareThreshold,
			Concurrency: r.Concurrency, Descriptors: rulesJSON(r.Descriptors),
		}
		out[i].Priority = r.Priority
	}
	return out
}

// MarshalJSON renders the rules in force, for GET /v1/rules:
// {"version": ..., "origin": {"source", "version"} (WithOrigin's, if
// any), "domains": [{"domain", "file", "line", "capacity",
// "descriptors"}]} (capacity, the elastic limits' pool, only if stated),
// domains sorted by name, descriptors in file order with the rules file's
// field names, each limit with its ID and period; then the overrides in
// force, if any: {"domain", "entries", "path", "limits", "expires"}.
func (s *Set) MarshalJSON() ([]byte, error) {
	type overrideJSON struct {
		Domain  string    `json:"domain"`
		Entries []Entry   `json:"entries"`
		Path    string    `json:"path"`
		Limits  []*Limit  `json:"limits"`
		Expires time.Time `json:"expires,omitzero"`
	}
	v := struct {
		Version   string         `json:"version"`
		Origin    *Origin        `json:"origin,omitempty"`
		Domains   []domainJSON   `json:"domains"`
		Overrides []overrideJSON `json:"overrides,omitempty"`
	}{Version: s.Version(), Origin: s.Origin(), Domains: []domainJSON{}}
	if s != nil {
		for _, name := range s.names {
			d := s.domains[name]
			v.Domains = append(v.Domains, domainJSON{
				Domain: d.name, File: d.file, Line: d.line, Capacity: d.capacity, Descriptors: rulesJSON(d.rules),
			})
		}
		for _, o := range s.Overrides() {
			v.Overrides = append(v.Overrides, overrideJSON{Domain: o.Domain, Entries: o.Entries,
				Path: o.Rule.Path, Limits: o.Rule.Limits, Expires: o.Expires})
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("rules %s: %w", s.Version(), err)
	}
	return b, nil
}

// glob is a value pattern whose * stand for any run of characters,
// possibly empty; parts are the text between the stars. The zero glob is
// not a pattern.
type glob struct {
	parts []string
}

func compileGlob(pattern string) glob {
	if !strings.Contains(pattern, "*") {
		return glob{}
	}
	return glob{parts: strings.Split(pattern, "*")}
}

// match reports whether s matches the pattern. Taking each middle part at
// its leftmost place is enough for patterns of * alone. It allocates
// nothing.
func (g glob) match(s string) bool {
	first, last := g.parts[0], g.parts[len(g.parts)-1]
	if !strings.HasPrefix(s, first) {
		return false
	}
	s = s[len(first):]
	for _, p := range g.parts[1 : len(g.parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

// Warnings returns what in s loads but may not be meant, as Errors placed
// like mistakes: each limit with requests_per_unit 0, which denies every
// request (Envoy's way to block a client), and each detailed_metric or
// value_to_metric that names metrics by values clients choose (a level
// with any value, or a wildcard): one series per value, of which sluice
// keeps the values seen most within a budget. Nil when there is none.
func (s *Set) Warnings() Errors {
	if s == nil {
		return nil
	}
	var ws Errors
	s.eachRule(func(r *Rule) {
		for _, l := range r.Limits {
			if l.Block {
				ws = append(ws, &Error{File: l.File, Line: l.Line, Path: r.errPath,
					Msg: fmt.Sprintf("requests_per_unit: 0 denies every request of %s", r.Path)})
			}
		}
		if w := clientNamed(r); w != "" {
			ws = append(ws, &Error{File: r.File, Line: r.Line, Path: r.errPath,
				Msg: fmt.Sprintf("%s: metrics named by each value of %s a client sends: one series per value; "+
					"the values seen most keep theirs (within the metrics' share of --max-memory), the others count under %s", w, r.Key, r.Path)})
		}
	})
	ws.sort()
	return ws
}

// minPacedSyncs is the fewest syncs a window in sync: async should span
// (PaceWarnings): async mode spreads what is left of a window over the
// syncs left in it, and over fewer than a few its servers' last
// allowances, each read before the others' hits were written, overshoot
// by up to what they admit in an interval.
const minPacedSyncs = 4

// PaceWarnings returns, as Errors placed like mistakes, each window limit
// (fixed_window, sliding_window) in sync: async whose period is shorter
// than minPacedSyncs sync intervals of interval (--sync-interval): a mode
// that cannot pay there. Limits of the server's default sync are not
// known here. Nil when there is none.
func (s *Set) PaceWarnings(interval time.Duration) Errors {
	if s == nil || interval <= 0 {
		return nil
	}
	var ws Errors
	s.eachRule(func(r *Rule) {
		for _, l := range r.Limits {
			if l.Sync != sluice.Async || l.Limit.Algorithm.HasBurst() || l.Limit.Period >= minPacedSyncs*interval {
				continue
			}
			ws = append(ws, &Error{File: l.File, Line: l.Line, Path: r.errPath,
				Msg: fmt.Sprintf("sync: async on a window of %v with a sync every %v (--sync-interval): fewer than %d syncs a window, "+
					"so its allowances cannot follow what is left; over the limit by up to what the servers admit in an interval: "+
					"sync: lease or exact, or a shorter --sync-interval, pays", l.Limit.Period, interval, minPacedSyncs)})
		}
	})
	ws.sort()
	return ws
}

// minGlobalUse is the share of a global limit below which
// GlobalWarnings warns: what its regions can use of a window.
const minGlobalUse = 0.9

// GlobalWarnings returns, as Errors placed like mistakes, each limit of
// scope global whose window (a bucket's: the window its count across
// regions is kept in, capacity × period / rate) spans too few of the
// regions' rounds (every round, at least round) to be filled: each round
// gives the regions together 1/share of what is left, so at most
// 1 − (1 − 1/share)^(window / round) of a window is usable; it warns
// below minGlobalUse, with that figure. round or share 0: no warnings.
func (s *Set) GlobalWarnings(round time.Duration, share int64) Errors {
	if s == nil || round <= 0 || share <= 0 {
		return nil
	}
	var ws Errors
	s.eachRule(func(r *Rule) {
		for _, l := range r.Limits {
			if l.Scope != sluice.GlobalScope || l.Unlimited || l.Block || l.Limit.Rate <= 0 {
				continue
			}
			w := l.Limit.Period
			if l.Limit.Algorithm.HasBurst() {
				w = time.Duration(float64(l.Limit.Period) * float64(l.Limit.Capacity()) / float64(l.Limit.Rate))
			}
			use := 1 - math.Pow(1-1/float64(share), float64(w)/float64(round))
			if use >= minGlobalUse {
				continue
			}
			ws = append(ws, &Error{File: l.File, Line: l.Line, Path: r.errPath,
				Msg: fmt.Sprintf("scope: global on a window of %v with a round every %v at best (--region-sync-interval; a peer's round trip when longer): "+
					"at most %.0f%% of the limit is usable (the regions take 1/%d of what is left a round); a window of %v or more fills %.0f%%",
					w, round, 100*use, share, time.Duration(math.Ceil(math.Log(1-minGlobalUse)/math.Log(1-1/float64(share))))*round, 100*minGlobalUse)})
		}
	})
	ws.sort()
	return ws
}

// eachRule calls f with every rule of s (not its overrides), domain by
// domain in name order, each rule before the rules under it.
func (s *Set) eachRule(f func(*Rule)) {
	var walk func(rules []*Rule)
	walk = func(rules []*Rule) {
		for _, r := range rules {
			f(r)
			walk(r.Descriptors)
		}
	}
	for _, name := range s.names {
		walk(s.domains[name].rules)
	}
}

// clientNamed returns "detailed_metric" or "value_to_metric" when r's
// metric names take values a client chooses (from a level whose value is
// any, or a wildcard), else "".
func clientNamed(r *Rule) string {
	anyValue := func(x *Rule) bool { return x.Value == "" || x.Wildcard() }
	if r.DetailedMetric {
		for _, p := range r.path {
			if anyValue(p) {
				return "detailed_metric"
			}
		}
	}
	if r.ValueToMetric && anyValue(r) {
		return "value_to_metric"
	}
	return ""
}
