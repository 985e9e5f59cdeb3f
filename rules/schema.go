package rules

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// DomainSpec is one domain's rules as data: the schema of a document of a
// rules file (Envoy ratelimit's format with sluice's extensions). Load
// decodes rules files into it and NewSet takes it as Go values; both go
// through the same validation. The json and yaml tags name the fields as
// rules files do, so a DomainSpec marshalled as JSON or YAML is a rules
// document that loads into the same rules, and a rules database can keep
// its rules in this form.
type DomainSpec struct {
	Domain      string           `json:"domain" yaml:"domain"`
	Descriptors []DescriptorSpec `json:"descriptors,omitempty" yaml:"descriptors,omitempty"`
	// Capacity is sluice's `capacity`: the domain's shared limit, the pool
	// whose room is the spare that `throttling: elastic` limits use.
	Capacity *RateLimitSpec `json:"capacity,omitempty" yaml:"capacity,omitempty"`
}

// DescriptorSpec is one descriptor of a DomainSpec; Rule describes what
// each field means. At most one of RateLimit and RateLimits is set.
type DescriptorSpec struct {
	Key            string           `json:"key" yaml:"key"`
	Value          string           `json:"value,omitempty" yaml:"value,omitempty"`
	RateLimit      *RateLimitSpec   `json:"rate_limit,omitempty" yaml:"rate_limit,omitempty"`
	RateLimits     []RateLimitSpec  `json:"rate_limits,omitempty" yaml:"rate_limits,omitempty"`
	Descriptors    []DescriptorSpec `json:"descriptors,omitempty" yaml:"descriptors,omitempty"`
	ShadowMode     bool             `json:"shadow_mode,omitempty" yaml:"shadow_mode,omitempty"`
	QuotaMode      bool             `json:"quota_mode,omitempty" yaml:"quota_mode,omitempty"`
	DetailedMetric bool             `json:"detailed_metric,omitempty" yaml:"detailed_metric,omitempty"`
	ValueToMetric  bool             `json:"value_to_metric,omitempty" yaml:"value_to_metric,omitempty"`
	ShareThreshold bool             `json:"share_threshold,omitempty" yaml:"share_threshold,omitempty"`
	// Metadata is Envoy's metadata: data of the JSON kinds (maps with
	// string keys, lists, strings, numbers, booleans and nil), kept with
	// the rule for the transport to return.
	Metadata map[string]any `json:"metadata,omitempty" yaml:"metadata,omitempty"`
	// Concurrency is sluice's `concurrency`: at most this many requests
	// of the descriptor in flight at once (0: no such limit).
	Concurrency int64 `json:"concurrency,omitempty" yaml:"concurrency,omitempty"`
	// Priority is sluice's `priority`: critical, default or sheddable,
	// the order in which load shedding spares requests; "" states none.
	Priority string `json:"priority,omitempty" yaml:"priority,omitempty"`
}

// RateLimitSpec is one limit of a DescriptorSpec; Limit describes what
// each field means. A zero field other than RequestsPerUnit means its
// default: Algorithm fixed_window, Burst the rate, UnitMultiplier 1,
// Throttling hard. RequestsPerUnit 0 is Envoy's: every request is denied.
type RateLimitSpec struct {
	Unit            string        `json:"unit,omitempty" yaml:"unit,omitempty"`
	RequestsPerUnit int64         `json:"requests_per_unit" yaml:"requests_per_unit"`
	Unlimited       bool          `json:"unlimited,omitempty" yaml:"unlimited,omitempty"`
	Name            string        `json:"name,omitempty" yaml:"name,omitempty"`
	Replaces        []ReplaceSpec `json:"replaces,omitempty" yaml:"replaces,omitempty"`
	Algorithm       string        `json:"algorithm,omitempty" yaml:"algorithm,omitempty"`
	Burst           int64         `json:"burst,omitempty" yaml:"burst,omitempty"`
	UnitMultiplier  int64         `json:"unit_multiplier,omitempty" yaml:"unit_multiplier,omitempty"`
	Throttling      string        `json:"throttling,omitempty" yaml:"throttling,omitempty"`
	ExceedPercent   int64         `json:"exceed_percent,omitempty" yaml:"exceed_percent,omitempty"`
	Sync            string        `json:"sync,omitempty" yaml:"sync,omitempty"`
	Scope           string        `json:"scope,omitempty" yaml:"scope,omitempty"`
	ElasticPercent  int64         `json:"elastic_percent,omitempty" yaml:"elastic_percent,omitempty"`
	Precision       int64         `json:"precision,omitempty" yaml:"precision,omitempty"`
}

// ReplaceSpec names a limit that a RateLimitSpec replaces (Envoy's
// replaces: [{name: ...}]).
type ReplaceSpec struct {
	Name string `json:"name" yaml:"name"`
}

// maxGlobalCount bounds rate × period (µs) of the count a region reads
// of a global limit (store/redis's SyncCounts, exact below 2^52).
const maxGlobalCount = 1 << 52

// globalCount returns the rate and period (µs) of the count store/regions
// keeps of l at scope global: l's own for a window limit; for a bucket,
// its capacity in windows of capacity × period / rate.
func globalCount(l sluice.Limit) (int64, int64) {
	p := l.Period.Microseconds()
	if !l.Algorithm.HasBurst() || l.Rate <= 0 {
		return l.Rate, p
	}
	c := l.Capacity()
	w := float64(c) * float64(p) / float64(l.Rate)
	if w > maxGlobalCount {
		return c, maxGlobalCount
	}
	return c, int64(w)
}

// scope sets l's Scope from ls's `scope:`, refusing scope: global where
// store/regions cannot keep one limit for all regions: a leaky_bucket
// (whose Wait orders every region's requests in one queue), a sliding_log
// (whose log of hits has no count to share) or a sliding_window of more
// than one sub-window (the regions share two windows' counts); a sync
// other than exact (a global limit is decided exactly in its region, so a
// missing sync is exact); and elastic throttling (whose pool is its
// region's).
func (c *checker) scope(ls *RateLimitSpec, l *Limit, path string) {
	scope, err := sluice.ParseScope(ls.Scope)
	if err != nil {
		if !c.bad(ls, "scope") {
			c.errorf(c.line(ls, "scope"), path, "scope: want region or global, got %q", ls.Scope)
		}
		return
	}
	l.Scope = scope
	if scope != sluice.GlobalScope || c.bad(ls, "scope") {
		return
	}
	line := c.line(ls, "scope")
	if a := l.Limit.Algorithm; a == sluice.LeakyBucket || a == sluice.SlidingLog {
		c.errorf(line, path, "scope: global is for fixed_window, sliding_window, token_bucket and gcra, not %s", a)
	}
	if l.Limit.SubWindows() > 1 {
		c.errorf(line, path, "scope: global shares a sliding_window's two windows between regions; precision above 1 is for scope: region")
	}
	if rate, p := globalCount(l.Limit); rate > 0 && p > 0 && rate > maxGlobalCount/p {
		c.errorf(line, path, "scope: global reads every region's count of it exactly, which needs its rate × period (µs) below 2^52: "+
			"%d a window of %v is more; scope: region has no such bound", rate, time.Duration(p)*time.Microsecond)
	}
	switch {
	case l.Sync == sluice.Lease || l.Sync == sluice.Async:
		c.errorf(line, path, "scope: global is decided exactly in its region; sync: %s cannot be", l.Sync)
	case l.Throttling == Elastic:
		c.errorf(line, path, "scope: global cannot be elastic: the pool is its region's")
	default:
		l.Sync = sluice.Exact
	}
}

// NewSet builds a Set from Go values with the validation Load applies to
// rules files (see Loader.NewSet).
func NewSet(domains ...DomainSpec) (*Set, error) { return Loader{}.NewSet(domains...) }

// NewSet builds a Set from Go values, validated as Load validates rules
// files; with ld.MergeDomains a domain may come in several parts. Mistakes
// are returned all at once as Errors whose Path locates each (the domain,
// then key=value of each descriptor down to it); File and Line are empty.
// The Set's Version is a digest of domains.
func (ld Loader) NewSet(domains ...DomainSpec) (*Set, error) {
	var errs Errors
	rp := &report{errs: &errs}
	c := &checker{rp: rp, budget: maxRules, envoyDomains: ld.EnvoyDomainNames}
	var parsed []*parsedDomain
	for i := range domains {
		if rp.over {
			break
		}
		if p := c.domain(&domains[i], fmt.Sprintf("domains[%d]", i)); p != nil {
			parsed = append(parsed, p)
		}
	}
	s := assemble(parsed, ld.MergeDomains, &errs)
	if len(errs) > 0 {
		return nil, errs
	}
	b, err := json.Marshal(domains)
	if err != nil { // the checker refused what JSON cannot hold
		return nil, fmt.Errorf("rules: %w", err)
	}
	sum := sha256.Sum256(b)
	s.version = hex.EncodeToString(sum[:8])
	return s, nil
}

// report collects the mistakes of one source (a rules file, or the Go
// values of one NewSet call), up to maxErrors of them.
type report struct {
	file string // "" for Go values
	errs *Errors
	n    int  // mistakes found in the source
	over bool // too many mistakes, or too large: stop
}

// maxErrors bounds the mistakes reported for one source.
const maxErrors = 100

// add reports a mistake at line of the file (0: the file as a whole), or
// at path for Go values.
func (rp *report) add(line int, path, msg string) {
	if rp.over {
		return
	}
	rp.n++
	switch {
	case rp.n < maxErrors:
		e := &Error{File: rp.file, Line: line, Path: path, Msg: msg}
		if rp.file == "" {
			e.Line = 0
		}
		*rp.errs = append(*rp.errs, e)
	case rp.n == maxErrors:
		*rp.errs = append(*rp.errs, &Error{File: rp.file, Msg: fmt.Sprintf("more than %d mistakes; the rest are not shown", maxErrors-1)})
		rp.over = true
	}
}

// spot is where a mapping of a rules file is: its line, the lines of its
// keys and values, and which fields the YAML decoder found wrong (and
// reported) before the schema saw them.
type spot struct {
	line   int
	keys   map[string][2]int // field: key line, value line
	bad    map[string]bool   // fields already reported
	broken bool              // a mistake inside the mapping itself was reported
}

// markBad records that the YAML decoder reported field.
func (sp *spot) markBad(field string) {
	if sp.bad == nil {
		sp.bad = map[string]bool{}
	}
	sp.bad[field] = true
}

// checker validates specs and builds the rules they describe. spots, set
// by the YAML decoder, place each spec in its file; without them (Go
// values) mistakes are placed by path.
type checker struct {
	rp    *report
	spots map[any]*spot
	// budget is how many more descriptors and limits the source may
	// state: YAML's node cap bounds a file, this bounds Go values alike.
	budget int
	// envoyDomains checks domain names by CheckEnvoyDomain
	// (Loader.EnvoyDomainNames), not CheckDomain.
	envoyDomains bool
}

// Caps on rules as data, whatever their source.
const (
	// maxRules bounds the descriptors and limits of one source.
	maxRules = maxNodes
	// maxDepth bounds how deep descriptors nest; Envoy's own examples
	// nest 3 deep.
	maxDepth = 64
)

// spend charges one descriptor or limit against the budget, reporting the
// source as too large once it is spent.
func (c *checker) spend(path string) bool {
	if c.rp.over {
		return false
	}
	c.budget--
	if c.budget < 0 {
		c.errorf(0, path, "too large: more than %d descriptors and limits", maxRules)
		c.rp.over = true
		return false
	}
	return true
}

// spot returns the spot of a spec, nil for Go values.
func (c *checker) spot(owner any) *spot {
	if c.spots == nil {
		return nil
	}
	return c.spots[owner]
}

// line returns the line of field's value in owner's mapping, or of the
// mapping when field is "" or absent.
func (c *checker) line(owner any, field string) int {
	sp := c.spot(owner)
	if sp == nil {
		return 0
	}
	if l, ok := sp.keys[field]; ok {
		return l[1]
	}
	return sp.line
}

// keyLine returns the line of field's key in owner's mapping, or of the
// mapping when absent.
func (c *checker) keyLine(owner any, field string) int {
	sp := c.spot(owner)
	if sp == nil {
		return 0
	}
	if l, ok := sp.keys[field]; ok {
		return l[0]
	}
	return sp.line
}

// bad reports whether the YAML decoder already reported field of owner.
func (c *checker) bad(owner any, field string) bool {
	sp := c.spot(owner)
	return sp != nil && sp.bad[field]
}

// broken reports whether the YAML decoder reported a mistake in owner's
// own mapping or in one of its fields.
func (c *checker) broken(owner any) bool {
	sp := c.spot(owner)
	if sp == nil {
		return false
	}
	for _, b := range sp.bad {
		if b {
			return true
		}
	}
	return sp.broken
}

func (c *checker) errorf(line int, path, format string, args ...any) {
	c.rp.add(line, path, fmt.Sprintf(format, args...))
}

// first names where an earlier thing was, for "(first at ...)": its line
// in a file, or its index among Go values.
func (c *checker) first(line, index int) string {
	if c.rp.file != "" {
		return "line " + strconv.Itoa(line)
	}
	return "index " + strconv.Itoa(index)
}

// parsedDomain is one domain as one source states it, validated.
type parsedDomain struct {
	name     string
	file     string
	line     int
	where    string // "file:line", or domains[i] for Go values
	rp       *report
	rules    []*Rule
	names    map[string]bool // names of the domain's limits
	replaces []replaceRef
	pool     *Limit // the domain's capacity, nil if none
}

// replaceRef is one entry of a limit's replaces, to check once the whole
// domain is known.
type replaceRef struct {
	name string
	line int
	path string
	rp   *report
}

// domain validates one domain; where names it for Go values.
func (c *checker) domain(ds *DomainSpec, where string) *parsedDomain {
	p := &parsedDomain{name: ds.Domain, file: c.rp.file, line: c.line(ds, "domain"), rp: c.rp, names: map[string]bool{}}
	if c.rp.file != "" {
		p.where = fmt.Sprintf("%s:%d", c.rp.file, p.line)
	} else {
		p.where = where
	}
	path := ds.Domain
	if path == "" {
		path = where
	}
	check := CheckDomain
	if c.envoyDomains {
		check = CheckEnvoyDomain
	}
	if err := check(ds.Domain); err != nil && !c.bad(ds, "domain") {
		c.errorf(c.line(ds, "domain"), path, "%v", err)
	}
	p.rules = c.descriptors(ds.Descriptors, p, nil, path)
	c.pool(ds, p, path)
	if p.name == "" {
		return nil
	}
	return p
}

// descriptors validates a list of descriptors nested in parent (nil at the
// top level), reporting descriptors that repeat a key and value.
func (c *checker) descriptors(specs []DescriptorSpec, p *parsedDomain, parent *Rule, path string) []*Rule {
	var out []*Rule
	type at struct{ line, index int }
	seen := map[Entry]at{}
	for i := range specs {
		if c.rp.over {
			return out
		}
		ds := &specs[i]
		if !c.spend(path) {
			return out
		}
		if parent != nil && parent.depth+1 >= maxDepth {
			c.errorf(c.line(ds, ""), path, "descriptors nested more than %d deep", maxDepth)
			return out
		}
		r := c.descriptor(ds, p, parent, path)
		if r == nil {
			continue
		}
		e := Entry{Key: r.Key, Value: r.Value}
		if first, dup := seen[e]; dup {
			if r.Value == "" {
				c.errorf(r.Line, r.errPath, "duplicate descriptor key %q without value (first at %s)", r.Key, c.first(first.line, first.index))
			} else {
				c.errorf(r.Line, r.errPath, "duplicate descriptor key %q value %q (first at %s)", r.Key, r.Value, c.first(first.line, first.index))
			}
			continue
		}
		seen[e] = at{r.Line, i}
		out = append(out, r)
	}
	return out
}

// descriptor validates one descriptor and what it nests.
func (c *checker) descriptor(ds *DescriptorSpec, p *parsedDomain, parent *Rule, path string) *Rule {
	r := &Rule{File: c.rp.file, Line: c.line(ds, ""), Domain: p.name, Key: ds.Key, Value: ds.Value,
		ShadowMode: ds.ShadowMode, QuotaMode: ds.QuotaMode, DetailedMetric: ds.DetailedMetric,
		ValueToMetric: ds.ValueToMetric, ShareThreshold: ds.ShareThreshold}
	r.errPath = path + "/" + ds.Key
	if ds.Value != "" {
		r.errPath += "=" + ds.Value
	}
	ok := !c.bad(ds, "key") && !c.bad(ds, "value")
	if ds.Key == "" && !c.bad(ds, "key") {
		c.errorf(c.line(ds, "key"), r.errPath, "key: must not be empty")
		ok = false
	}
	r.glob = compileGlob(r.Value)
	if r.ShareThreshold && !r.Wildcard() {
		c.errorf(c.keyLine(ds, "share_threshold"), r.errPath, "share_threshold: only a wildcard value (with *) can share its threshold")
	}
	if len(ds.Metadata) > 0 && !c.bad(ds, "metadata") {
		if err := checkJSONData(ds.Metadata, 0); err != nil {
			c.errorf(c.line(ds, "metadata"), r.errPath, "metadata: %v", err)
		} else {
			r.Metadata = ds.Metadata
		}
	}

	c.protection(ds, r)

	r.Path = p.name + "." + r.Key
	if r.Value != "" {
		r.Path += "_" + r.Value
	}
	if parent != nil {
		r.depth = parent.depth + 1
		r.Path = parent.Path + "." + r.Path[len(p.name)+1:]
		r.path = append(r.path, parent.path...)
	}
	r.path = append(r.path, r)

	switch {
	case ds.RateLimit != nil && len(ds.RateLimits) > 0:
		c.errorf(c.keyLine(ds, "rate_limits"), r.errPath, "descriptor: rate_limit and rate_limits together; put every limit in rate_limits")
	case ds.RateLimit != nil:
		if l := c.rateLimit(ds.RateLimit, "rate_limit", p, r.errPath+"/rate_limit"); l != nil {
			r.Limits = []*Limit{l}
		}
	case len(ds.RateLimits) > 0:
		r.Limits = c.rateLimits(ds.RateLimits, p, r.errPath)
	}
	setIDs(r)
	if r.Concurrency > 0 {
		r.ConcurrencyID = limitID(r, nil, -1)
	}
	r.Descriptors = c.descriptors(ds.Descriptors, p, r, r.errPath)
	if !ok {
		return nil
	}
	return r
}

// MaxConcurrency caps a descriptor's `concurrency`: a store keeps one
// entry per request in flight, so a key holds at most this many.
const MaxConcurrency = 100_000

// Priorities of load shedding, as rules files name them.
const (
	// PriorityCritical is shed last, only once nothing else is left.
	PriorityCritical = "critical"
	// PriorityDefault is the priority of a request whose rules state
	// none; a rule may state it, to hold its requests above sheddable.
	PriorityDefault = "default"
	// PrioritySheddable is shed first.
	PrioritySheddable = "sheddable"
)

// protection validates a descriptor's concurrency and priority into r.
func (c *checker) protection(ds *DescriptorSpec, r *Rule) {
	switch v := ds.Concurrency; {
	case c.bad(ds, "concurrency"):
	case v < 0 || v > MaxConcurrency:
		c.errorf(c.line(ds, "concurrency"), r.errPath, "concurrency: must be between 1 and %d, got %d", MaxConcurrency, v)
	default:
		r.Concurrency = v
	}
	switch ds.Priority {
	case "": // none: the rule takes no part in a request's priority
	case PriorityDefault, PriorityCritical, PrioritySheddable:
		r.Priority = ds.Priority
	default:
		if !c.bad(ds, "priority") {
			c.errorf(c.line(ds, "priority"), r.errPath, "priority: want critical, default or sheddable, got %q", ds.Priority)
		}
	}
}

// maxDataDepth bounds the nesting of metadata, as JSON decoders do.
const maxDataDepth = 100

// checkJSONData reports a value in v that JSON cannot hold as it is: other
// kinds than maps with string keys, lists, strings, numbers, booleans and
// nil, or floats that are not finite.
func checkJSONData(v any, depth int) error {
	if depth > maxDataDepth {
		return fmt.Errorf("nested more than %d deep", maxDataDepth)
	}
	switch x := v.(type) {
	case nil, string, bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return nil
	case float32:
		return checkJSONData(float64(x), depth)
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return fmt.Errorf("%v is not a JSON number", x)
		}
		return nil
	case map[string]any:
		for k, e := range x {
			if err := checkJSONData(e, depth+1); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	case []any:
		for i, e := range x {
			if err := checkJSONData(e, depth+1); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	}
	return fmt.Errorf("a %s is not JSON data", reflect.TypeOf(v))
}

// rateLimits validates a list of limits that all apply to one descriptor.
func (c *checker) rateLimits(specs []RateLimitSpec, p *parsedDomain, path string) []*Limit {
	var out []*Limit
	type at struct{ line, index int }
	seen := map[sluice.Limit]at{}
	for i := range specs {
		ls := &specs[i]
		where := fmt.Sprintf("%s/rate_limits[%d]", path, i)
		l := c.rateLimit(ls, "rate_limits", p, where)
		if l == nil {
			continue
		}
		if l.Unlimited && len(specs) > 1 {
			c.errorf(l.Line, where, "rate_limits: an unlimited limit cannot sit beside others")
			continue
		}
		if first, dup := seen[l.Limit]; dup && !l.Unlimited {
			c.errorf(l.Line, where, "rate_limits: the same limit twice (first at %s)", c.first(first.line, first.index))
			continue
		}
		seen[l.Limit] = at{l.Line, i}
		out = append(out, l)
	}
	return out
}

// unitNames lists the units for messages.
const unitNames = "second, minute, hour, day, week, month or year"

// rateLimit validates one limit; what names it in messages (rate_limit or
// rate_limits) and path places it for Go values.
func (c *checker) rateLimit(ls *RateLimitSpec, what string, p *parsedDomain, path string) *Limit {
	start := c.rp.n
	if !c.spend(path) {
		return nil
	}
	l := &Limit{File: c.rp.file, Line: c.line(ls, ""), Name: ls.Name}
	if l.Name != "" {
		p.names[l.Name] = true
	}
	l.Replaces = c.replaces(ls, p, path)
	if ls.Unlimited {
		return c.unlimited(ls, l, path, start)
	}
	lc := &limitCheck{c: c, ls: ls, l: l, what: what, path: path}
	for _, field := range limitFields {
		field(lc)
	}
	c.scope(ls, l, path)
	switch {
	case c.rp.n > start || c.broken(ls):
		return nil
	case l.Block:
		return lc.blocked(start)
	case !lc.valid() || !lc.pastLimit():
		return nil
	}
	return l
}

// unlimited checks an unlimited limit l: Envoy's ratelimit rejects a unit
// beside unlimited and ignores requests_per_unit; sluice's extensions make
// no sense there either.
func (c *checker) unlimited(ls *RateLimitSpec, l *Limit, path string, start int) *Limit {
	l.Unlimited = true
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"unit", ls.Unit != ""}, {"algorithm", ls.Algorithm != ""}, {"burst", ls.Burst != 0},
		{"unit_multiplier", ls.UnitMultiplier != 0}, {"throttling", ls.Throttling != ""},
		{"exceed_percent", ls.ExceedPercent != 0}, {"sync", ls.Sync != ""}, {"scope", ls.Scope != ""},
		{"elastic_percent", ls.ElasticPercent != 0},
	} {
		if f.set && !c.bad(ls, f.name) {
			c.errorf(c.keyLine(ls, f.name), path, "%s: not allowed with unlimited: true", f.name)
		}
	}
	if c.rp.n > start || c.broken(ls) {
		return nil
	}
	return l
}

// limitCheck is one limit being checked by rateLimit: its spec, the Limit
// made of it, and the lines its messages point at.
type limitCheck struct {
	c          *checker
	ls         *RateLimitSpec
	l          *Limit
	what, path string
	period     time.Duration
	// The lines of the fields Limit.Validate's errors name.
	unitLine, rateLine, algLine, burstLine, precLine, throttleLine int
}

// limitFields check the fields of a limit, one concern each, in the order
// their messages come.
var limitFields = []func(*limitCheck){
	(*limitCheck).unit, (*limitCheck).rate, (*limitCheck).algorithm, (*limitCheck).burst,
	(*limitCheck).precision, (*limitCheck).throttling, (*limitCheck).elastic, (*limitCheck).exceed,
	(*limitCheck).sync,
}

// unit checks unit and unit_multiplier, which make the period.
func (lc *limitCheck) unit() {
	c, ls, l, path := lc.c, lc.ls, lc.l, lc.path
	lc.unitLine = c.line(ls, "unit")
	switch {
	case c.bad(ls, "unit"):
	case ls.Unit == "":
		c.errorf(c.line(ls, ""), path, "%s: missing unit (%s)", lc.what, unitNames)
	default:
		l.Unit = strings.ToLower(ls.Unit) // Envoy's ratelimit reads SECOND as second
		var ok bool
		if lc.period, ok = unitPeriod(l.Unit); !ok {
			c.errorf(lc.unitLine, path, "unit: unknown unit %q (want %s)", ls.Unit, unitNames)
		}
	}
	l.UnitMultiplier = 1
	if m := ls.UnitMultiplier; m != 0 && !c.bad(ls, "unit_multiplier") {
		line := c.line(ls, "unit_multiplier")
		switch {
		case m < 1:
			c.errorf(line, path, "unit_multiplier: must be at least 1, got %d", m)
		case lc.period > 0 && m > math.MaxInt64/int64(lc.period):
			c.errorf(line, path, "unit_multiplier: %d %ss is too long", m, l.Unit)
		default:
			l.UnitMultiplier = m
			lc.unitLine = line
		}
	}
	l.Limit.Period = lc.period * time.Duration(l.UnitMultiplier)
}

// rate checks requests_per_unit: 0 blocks every request, as in Envoy.
func (lc *limitCheck) rate() {
	c, ls := lc.c, lc.ls
	lc.rateLine = c.line(ls, "requests_per_unit")
	switch v := ls.RequestsPerUnit; {
	case c.bad(ls, "requests_per_unit"):
	case v < 0:
		c.errorf(lc.rateLine, lc.path, "requests_per_unit: must be at least 0 (0 denies every request), got %d", v)
	case v == 0:
		lc.l.Block = true // Envoy's meaning: every request is over the limit
	default:
		lc.l.Limit.Rate = v
	}
}

// algorithm checks algorithm.
func (lc *limitCheck) algorithm() {
	c, ls := lc.c, lc.ls
	lc.algLine = c.line(ls, "algorithm")
	if ls.Algorithm != "" && !c.bad(ls, "algorithm") {
		a, err := sluice.ParseAlgorithm(ls.Algorithm)
		if err != nil {
			c.errorf(lc.algLine, lc.path, "algorithm: %v", err)
		}
		lc.l.Limit.Algorithm = a
	}
}

// burst checks burst.
func (lc *limitCheck) burst() {
	c, ls := lc.c, lc.ls
	lc.burstLine = c.line(ls, "burst")
	if b := ls.Burst; b != 0 && !c.bad(ls, "burst") {
		if b < 1 {
			c.errorf(lc.burstLine, lc.path, "burst: must be at least 1, got %d", b)
		}
		lc.l.Limit.Burst = b
	}
}

// precision checks precision, a sliding window's.
func (lc *limitCheck) precision() {
	c, ls, l := lc.c, lc.ls, lc.l
	lc.precLine = c.line(ls, "precision")
	if v := ls.Precision; v != 0 && !c.bad(ls, "precision") {
		switch {
		case l.Limit.Algorithm != sluice.SlidingWindow:
			c.errorf(c.keyLine(ls, "precision"), lc.path, "precision: only with algorithm: sliding_window, not %s", l.Limit.Algorithm)
		case v < 1 || v > sluice.MaxPrecision:
			c.errorf(lc.precLine, lc.path, "precision: must be between 1 and %d, got %d", sluice.MaxPrecision, v)
		}
		l.Limit.Precision = v
	}
}

// throttlings are the values of throttling.
var throttlings = map[string]Throttling{"": Hard, "hard": Hard, "soft": Soft, "elastic": Elastic}

// throttling checks throttling.
func (lc *limitCheck) throttling() {
	c, ls := lc.c, lc.ls
	lc.throttleLine = c.line(ls, "throttling")
	t, ok := throttlings[ls.Throttling]
	if !ok && !c.bad(ls, "throttling") {
		c.errorf(lc.throttleLine, lc.path, "throttling: want hard, soft or elastic, got %q", ls.Throttling)
	}
	lc.l.Throttling = t
}

// elastic checks elastic_percent, which elastic throttling needs.
func (lc *limitCheck) elastic() {
	lc.percent("elastic_percent", lc.ls.ElasticPercent, Elastic, "throttling: elastic needs elastic_percent (how far past the limit the pool's spare may take it)")
}

// exceed checks exceed_percent, which soft throttling needs.
func (lc *limitCheck) exceed() {
	lc.percent("exceed_percent", lc.ls.ExceedPercent, Soft, "throttling: soft needs exceed_percent (how far past the limit to admit)")
}

// percent checks field, whose value is v, a percentage past the limit
// that throttling t takes and needs (missing says so).
func (lc *limitCheck) percent(field string, v int64, t Throttling, missing string) {
	c, ls, l := lc.c, lc.ls, lc.l
	switch {
	case c.bad(ls, field):
	case v != 0 && l.Throttling != t:
		c.errorf(c.keyLine(ls, field), lc.path, "%s: only with throttling: %s", field, t)
	case v != 0 && (v < 1 || v > 1_000_000):
		c.errorf(c.line(ls, field), lc.path, "%s: must be between 1 and 1000000, got %d", field, v)
	case v != 0:
		l.ExceedPercent = v
	case l.Throttling == t:
		c.errorf(lc.throttleLine, lc.path, "%s", missing)
	}
}

// sync checks sync: lease and async are not for what only exact counts.
func (lc *limitCheck) sync() {
	c, ls, l := lc.c, lc.ls, lc.l
	sync, err := sluice.ParseSync(ls.Sync)
	switch {
	case err != nil:
		if !c.bad(ls, "sync") {
			c.errorf(c.line(ls, "sync"), lc.path, "sync: want exact, lease or async, got %q", ls.Sync)
		}
	case sync == sluice.Lease || sync == sluice.Async:
		if a := l.Limit.Algorithm; a == sluice.SlidingLog && !c.bad(ls, "sync") {
			c.errorf(c.line(ls, "sync"), lc.path, "sync: %s is for every algorithm but sliding_log, which is exact only", ls.Sync)
		}
		if l.Limit.SubWindows() > 1 && !c.bad(ls, "sync") {
			c.errorf(c.line(ls, "sync"), lc.path, "sync: %s keeps a sliding_window's two windows; precision above 1 is exact only", ls.Sync)
		}
	}
	l.Sync = sync
}

// blocked checks a limit that denies every request (requests_per_unit:
// 0): nothing is counted, so a burst or soft throttling would mean
// nothing, but the period must still be one the algorithms could count
// in.
func (lc *limitCheck) blocked(start int) *Limit {
	c, ls, l := lc.c, lc.ls, lc.l
	if l.Limit.Burst != 0 {
		c.errorf(c.keyLine(ls, "burst"), lc.path, "burst: not allowed with requests_per_unit: 0 (every request is denied)")
	}
	if l.Throttling != Hard {
		c.errorf(c.keyLine(ls, "throttling"), lc.path, "throttling: %s is not allowed with requests_per_unit: 0 (every request is denied)", l.Throttling)
	}
	if c.rp.n > start {
		return nil
	}
	check := l.Limit
	check.Rate = 1
	if err := check.Validate(); err != nil {
		c.errorf(lc.unitLine, lc.path, "unit: %v", err)
		return nil
	}
	return l
}

// valid reports whether the limit's arithmetic accepts it
// (sluice.Limit.Validate), and else reports why at the field it names.
func (lc *limitCheck) valid() bool {
	c, l := lc.c, lc.l
	err := l.Limit.Validate()
	if err == nil {
		return true
	}
	var fe *sluice.FieldError
	if !errors.As(err, &fe) {
		c.errorf(l.Line, lc.path, "%s: %v", lc.what, err)
		return false
	}
	fields := map[string]struct {
		name string
		line int
	}{
		"Rate": {"requests_per_unit", lc.rateLine}, "Burst": {"burst", lc.burstLine}, "Period": {"unit", lc.unitLine},
		"Algorithm": {"algorithm", lc.algLine}, "Precision": {"precision", lc.precLine},
	}
	if f, ok := fields[fe.Field]; ok {
		c.errorf(f.line, lc.path, "%s: %s", f.name, fe.Reason)
	} else {
		c.errorf(l.Line, lc.path, "%s: %s", lc.what, err)
	}
	return false
}

// pastLimit reports whether a soft or elastic limit's percentage past the
// limit makes a limit the arithmetic accepts that admits more, and else
// reports why.
func (lc *limitCheck) pastLimit() bool {
	c, l := lc.c, lc.l
	if l.Throttling == Hard {
		return true
	}
	field := "exceed_percent"
	if l.Throttling == Elastic {
		field = "elastic_percent"
	}
	if err := softLimit(l.Limit, l.ExceedPercent).Validate(); err != nil {
		c.errorf(lc.throttleLine, lc.path, "%s: %d%% past %s is too large: %v", field, l.ExceedPercent, l.Limit, err)
		return false
	}
	if softLimit(l.Limit, l.ExceedPercent) == l.Limit || (l.Throttling == Elastic && l.Excess().Validate() != nil) {
		c.errorf(lc.throttleLine, lc.path, "%s: %d%% past %s admits nothing more (the excess rounds down to 0); raise %s", field, l.ExceedPercent, l.Limit, field)
		return false
	}
	return true
}

// pool validates the domain's capacity and gives it to every elastic
// limit of p, which needs one.
func (c *checker) pool(ds *DomainSpec, p *parsedDomain, path string) {
	var pool *Limit
	if ds.Capacity != nil && !c.bad(ds, "capacity") {
		pool = c.rateLimit(ds.Capacity, "capacity", p, path+"/capacity")
		if pool != nil && (pool.Unlimited || pool.Block || pool.Throttling != Hard || pool.Sync != sluice.DefaultSync || pool.Name != "" || len(pool.Replaces) > 0) {
			c.errorf(pool.Line, path+"/capacity", "capacity: a plain limit (unit, requests_per_unit, algorithm, burst, unit_multiplier) and nothing else")
			pool = nil
		}
		if pool != nil {
			pool.ID = limitID(&Rule{Domain: ds.Domain, path: []*Rule{{Value: "capacity"}}}, pool, 0) // no descriptor has an empty key: no other limit has this ID
		}
	}
	p.pool = pool
	var walk func(rs []*Rule)
	walk = func(rs []*Rule) {
		for _, r := range rs {
			for _, l := range r.Limits {
				if l.Throttling != Elastic {
					continue
				}
				if pool == nil && ds.Capacity == nil {
					c.errorf(l.Line, r.errPath, "throttling: elastic needs the domain's capacity (capacity: {unit: ..., requests_per_unit: ...} beside domain)")
				}
				l.Pool = pool
			}
			walk(r.Descriptors)
		}
	}
	walk(p.rules)
}

// replaces validates Envoy's replaces of a limit: names to resolve once the
// whole domain is known.
func (c *checker) replaces(ls *RateLimitSpec, p *parsedDomain, path string) []string {
	var out []string
	for i := range ls.Replaces {
		rs := &ls.Replaces[i]
		if c.bad(rs, "name") {
			continue
		}
		line := c.line(rs, "name")
		switch {
		case rs.Name == "":
			c.errorf(line, path, "replaces: name must not be empty")
		case rs.Name == ls.Name:
			c.errorf(line, path, "replaces: a limit cannot replace itself (%q)", rs.Name)
		default:
			out = append(out, rs.Name)
			p.replaces = append(p.replaces, replaceRef{rs.Name, line, path, c.rp})
		}
	}
	return out
}

// softLimit scales the rate and burst of l by (100+percent)/100, rounded
// down: what soft throttling admits. It is exact for every rate, burst and
// percent; a result beyond int64 saturates at math.MaxInt64 (which
// sluice.Limit.Validate then refuses). percent must not be negative.
func softLimit(l sluice.Limit, percent int64) sluice.Limit {
	scale := func(v int64) int64 {
		hi, lo := bits.Mul64(uint64(v), uint64(100+percent))
		if hi >= 100 { // the quotient needs more than 64 bits
			return math.MaxInt64
		}
		q, _ := bits.Div64(hi, lo, 100)
		if q > math.MaxInt64 {
			return math.MaxInt64
		}
		return int64(q)
	}
	l.Rate = scale(l.Rate)
	if l.Burst > 0 {
		l.Burst = scale(l.Burst)
	}
	return l
}

// unitPeriod returns the period of a rules file's unit, as Envoy's
// ratelimit divides time: a month is 30 days and a year 365 days.
func unitPeriod(unit string) (time.Duration, bool) {
	const day = 24 * time.Hour
	switch unit {
	case "second":
		return time.Second, true
	case "minute":
		return time.Minute, true
	case "hour":
		return time.Hour, true
	case "day":
		return day, true
	case "week":
		return 7 * day, true
	case "month":
		return 30 * day, true
	case "year":
		return 365 * day, true
	}
	return 0, false
}

// setIDs gives each limit of r its ID. Limits of r that share an algorithm
// and a period are told apart by their order among themselves.
func setIDs(r *Rule) {
	type kind struct {
		alg    sluice.Algorithm
		period time.Duration
	}
	var seen map[kind]int
	for _, l := range r.Limits {
		k := kind{l.Limit.Algorithm, l.Limit.Period}
		n := 0
		if len(r.Limits) > 1 {
			if seen == nil {
				seen = make(map[kind]int, len(r.Limits))
			}
			n = seen[k]
			seen[k] = n + 1
		}
		l.ID = limitID(r, l, n)
	}
}

// limitID derives a limit's ID from what it counts: its place (domain,
// then each level's key and value), its algorithm and its period, and,
// when nth > 0, its order among the limits of the same descriptor with
// that algorithm and period. The rate and burst are left out, so that
// changing them keeps the count. nth < 0 (and a nil l) derives the ID of
// r's concurrency limit instead.
func limitID(r *Rule, l *Limit, nth int) string {
	h := sha256.New()
	var buf []byte
	str := func(s string) {
		buf = binary.AppendUvarint(buf[:0], uint64(len(s)))
		h.Write(buf)
		io.WriteString(h, s)
	}
	num := func(v int64) {
		buf = binary.AppendVarint(buf[:0], v)
		h.Write(buf)
	}
	str(r.Domain)
	for _, p := range r.path {
		str(p.Key)
		str(p.Value)
	}
	switch {
	case nth < 0: // the descriptor's concurrency limit, not a rate limit
		str("concurrency")
	case l.Unlimited:
		str("unlimited")
	default:
		str(l.Limit.Algorithm.String())
		num(l.Limit.Period.Microseconds())
		if n := l.Limit.SubWindows(); n > 1 { // precision 1 keeps the ID it had before precision existed
			str("precision")
			num(n)
		}
	}
	if nth > 0 {
		num(int64(nth))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// assemble makes a Set of validated domains, in the order their sources
// came: a domain stated twice is a mistake unless merge is set, in which
// case its top-level descriptors are joined (Envoy's MERGE_DOMAIN_CONFIG)
// and must not repeat a key and value. Then each limit's replaces must name
// a limit of its domain. The Set has no version yet.
func assemble(parsed []*parsedDomain, merge bool, errs *Errors) *Set {
	s := &Set{domains: map[string]*domain{}}
	firsts := map[string]*parsedDomain{}
	parts := map[string][]*parsedDomain{}
	for _, p := range parsed {
		first, dup := firsts[p.name]
		if dup && !merge {
			p.rp.add(p.line, p.name, fmt.Sprintf("duplicate domain %q (first at %s)", p.name, first.where))
			continue
		}
		if !dup {
			firsts[p.name] = p
			d := &domain{name: p.name, file: p.file, line: p.line}
			s.domains[p.name] = d
			s.names = append(s.names, p.name)
		}
		d := s.domains[p.name]
		if p.pool != nil {
			// One pool per domain: merged parts that each stated one
			// would leave "the domain's spare" ambiguous.
			if d.capacity != nil {
				p.rp.add(p.pool.Line, p.name+"/capacity", fmt.Sprintf("capacity: domain %q has one already (at %s)", p.name, d.capacity.Place()))
			} else {
				d.capacity = p.pool
			}
		}
		type at struct {
			rule *Rule
			p    *parsedDomain
		}
		seen := make(map[Entry]at, len(d.rules))
		for _, r := range d.rules {
			seen[Entry{Key: r.Key, Value: r.Value}] = at{r, nil}
		}
		for _, r := range p.rules {
			if f, dup := seen[Entry{Key: r.Key, Value: r.Value}]; dup {
				where := f.rule.errPath
				if f.rule.File != "" {
					where = fmt.Sprintf("%s:%d", f.rule.File, f.rule.Line)
				}
				what := fmt.Sprintf("value %q", r.Value)
				if r.Value == "" {
					what = "without value"
				}
				p.rp.add(r.Line, r.errPath, fmt.Sprintf("duplicate descriptor key %q %s in domain %q (first at %s)", r.Key, what, p.name, where))
				continue
			}
			d.rules = append(d.rules, r)
		}
		parts[p.name] = append(parts[p.name], p)
	}
	for name, ps := range parts {
		names := map[string]bool{}
		for _, p := range ps {
			for n := range p.names {
				names[n] = true
			}
		}
		for _, p := range ps {
			for _, r := range p.replaces {
				if !names[r.name] {
					r.rp.add(r.line, r.path, fmt.Sprintf("replaces: no limit named %q in domain %q", r.name, name))
				}
			}
		}
	}
	if len(*errs) > 0 {
		errs.sort()
		return nil
	}
	for _, d := range s.domains {
		d.root.index(d.rules)
	}
	slices.Sort(s.names)
	return s
}
