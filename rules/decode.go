package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"go.yaml.in/yaml/v3"
)

// maxNodes bounds the YAML nodes one file may expand to, aliases followed,
// so that a file of nested aliases (a "billion laughs") cannot exhaust
// memory or time.
const maxNodes = 1 << 20

// maxErrors bounds the mistakes reported for one file.
const maxErrors = 100

// Keys allowed in each kind of mapping.
var (
	domainKeys     = []string{"domain", "descriptors"}
	descriptorKeys = []string{"key", "value", "rate_limit", "rate_limits", "descriptors",
		"shadow_mode", "detailed_metric", "value_to_metric", "share_threshold"}
	rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "unit_multiplier", "throttling", "exceed_percent"}
	replacesKeys = []string{"name"}
)

// source is one rules file's name and contents.
type source struct {
	name string
	data []byte
}

// decoder decodes the documents of one file, collecting every mistake.
type decoder struct {
	file   string
	errs   *Errors
	budget int  // nodes left to visit before the file counts as too large
	nerr   int  // mistakes found in the file
	over   bool // too large or too many mistakes: stop
}

// parsedDomain is one document of a rules file: a domain and its rules.
type parsedDomain struct {
	name     string
	file     string
	line     int
	rules    []*Rule
	names    map[string]bool // names of the domain's limits
	replaces []replaceRef
}

// replaceRef is one entry of a limit's replaces, to check once the whole
// domain is known.
type replaceRef struct {
	name string
	line int
}

// errorf reports a mistake at line of the file, up to maxErrors of them.
func (d *decoder) errorf(line int, format string, args ...any) {
	d.nerr++
	switch {
	case d.nerr < maxErrors:
		*d.errs = append(*d.errs, &Error{File: d.file, Line: line, Msg: fmt.Sprintf(format, args...)})
	case d.nerr == maxErrors:
		*d.errs = append(*d.errs, &Error{File: d.file, Msg: fmt.Sprintf("more than %d mistakes; the rest are not shown", maxErrors-1)})
		d.over = true
	}
}

// decodeFile decodes every YAML document of src, one domain each.
func decodeFile(src source, errs *Errors) []*parsedDomain {
	d := &decoder{file: src.name, errs: errs, budget: maxNodes}
	dec := yaml.NewDecoder(bytes.NewReader(src.data))
	var out []*parsedDomain
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, msg := syntaxError(err)
			d.errorf(line, "%s", msg)
			return nil
		}
		if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
			continue // an empty document, such as a trailing ---
		}
		if p := d.domain(doc.Content[0]); p != nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 && d.nerr == 0 {
		d.errorf(0, "no domain: the file is empty")
	}
	return out
}

// syntaxError splits the YAML parser's "yaml: line N: msg" into its line
// and message.
func syntaxError(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				return line, "invalid YAML: " + after
			}
		}
	}
	return 0, "invalid YAML: " + msg
}

// visit resolves aliases and charges one node against the budget; it
// returns nil once the file has expanded past maxNodes.
func (d *decoder) visit(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if d.over {
		return nil
	}
	d.budget--
	if d.budget < 0 {
		d.over = true
		line := 0
		if n != nil {
			line = n.Line
		}
		d.errorf(line, "too large: the file expands to more than %d YAML nodes", maxNodes)
		return nil
	}
	return n
}

// describe names what a node holds, for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!bool":
			return "a boolean " + strconv.Quote(n.Value)
		case "!!int", "!!float":
			return "a number " + n.Value
		}
		return "a string " + strconv.Quote(n.Value)
	}
	return "a YAML document"
}

// field is one key of a mapping and its value.
type field struct {
	key, val *yaml.Node
}

// fields returns the keys of mapping n that are in allowed, reporting
// unknown and repeated keys. Merge keys (<<: *anchor) are expanded; keys
// written out override merged ones. what names the mapping in messages.
func (d *decoder) fields(n *yaml.Node, what string, allowed []string) map[string]field {
	out := make(map[string]field, len(n.Content)/2)
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.visit(n.Content[i]), d.visit(n.Content[i+1])
		if k == nil || v == nil {
			return out
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k.Line, "%s: want a key, got %s", what, describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merged = append(merged, v)
			continue
		}
		if first, dup := out[k.Value]; dup {
			d.errorf(k.Line, "%s: duplicate key %q (first at line %d)", what, k.Value, first.key.Line)
			continue
		}
		if !contains(allowed, k.Value) {
			d.errorf(k.Line, "%s: unknown key %q (want %s)", what, k.Value, strings.Join(allowed, ", "))
			continue
		}
		out[k.Value] = field{k, v}
	}
	for _, m := range merged {
		var maps []*yaml.Node
		switch m.Kind {
		case yaml.MappingNode:
			maps = []*yaml.Node{m}
		case yaml.SequenceNode:
			for _, c := range m.Content {
				if c = d.visit(c); c != nil {
					maps = append(maps, c)
				}
			}
		}
		for _, mm := range maps {
			if mm.Kind != yaml.MappingNode {
				d.errorf(mm.Line, "%s: <<: want a mapping to merge, got %s", what, describe(mm))
				continue
			}
			for name, f := range d.fields(mm, what, allowed) {
				if _, ok := out[name]; !ok {
					out[name] = f
				}
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// str reads a scalar as text, as Envoy's YAML decoder does for its string
// fields (value: 200 is the string "200"). ok is false, with the mistake
// reported, for a mapping, a list or nothing.
func (d *decoder) str(f field) (string, bool) {
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() == "!!null" {
		d.errorf(f.val.Line, "%s: want a string, got %s", f.key.Value, describe(f.val))
		return "", false
	}
	return f.val.Value, true
}

// boolean reads true or false, and, unquoted, YAML 1.1's yes, no, on
// and off, which Envoy's YAML decoder reads as booleans too.
func (d *decoder) boolean(f field) bool {
	n := f.val
	if n.Kind == yaml.ScalarNode && n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
		switch n.Value {
		case "yes", "Yes", "YES", "on", "On", "ON":
			return true
		case "no", "No", "NO", "off", "Off", "OFF":
			return false
		}
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		d.errorf(n.Line, "%s: want true or false, got %s", f.key.Value, describe(n))
		return false
	}
	return b
}

// integer reads a whole number.
func (d *decoder) integer(f field) (int64, bool) {
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() != "!!int" && isDigits(strings.TrimLeft(f.val.Value, "+-")) {
		d.errorf(f.val.Line, "%s: %s is out of range", f.key.Value, f.val.Value)
		return 0, false
	}
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!int" {
		d.errorf(f.val.Line, "%s: want a whole number, got %s", f.key.Value, describe(f.val))
		return 0, false
	}
	var v int64
	if err := f.val.Decode(&v); err != nil {
		d.errorf(f.val.Line, "%s: %s is out of range", f.key.Value, f.val.Value)
		return 0, false
	}
	return v, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// domain decodes one document: domain and descriptors.
func (d *decoder) domain(n *yaml.Node) *parsedDomain {
	if n = d.visit(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, "want a mapping with domain and descriptors, got %s", describe(n))
		return nil
	}
	fs := d.fields(n, "rules file", domainKeys)
	p := &parsedDomain{file: d.file, line: n.Line, names: map[string]bool{}}
	if f, ok := fs["domain"]; !ok {
		d.errorf(n.Line, "missing domain")
	} else if name, ok := d.str(f); ok {
		if name == "" {
			d.errorf(f.val.Line, "domain: must not be empty")
		}
		p.name, p.line = name, f.key.Line
	}
	if f, ok := fs["descriptors"]; ok {
		p.rules = d.descriptors(f, p, nil)
	}
	for _, r := range p.replaces {
		if !p.names[r.name] {
			d.errorf(r.line, "replaces: no limit named %q in domain %q", r.name, p.name)
		}
	}
	if p.name == "" {
		return nil
	}
	return p
}

// descriptors decodes a list of descriptors nested in parent (nil at the
// top level), reporting descriptors that repeat a key and value.
func (d *decoder) descriptors(f field, p *parsedDomain, parent *Rule) []*Rule {
	n := f.val
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "descriptors: want a list of descriptors, got %s", describe(n))
		return nil
	}
	var out []*Rule
	seen := map[Entry]int{}
	for _, c := range n.Content {
		r := d.descriptor(c, p, parent)
		if r == nil {
			continue
		}
		e := Entry{r.Key, r.Value}
		if first, dup := seen[e]; dup {
			if r.Value == "" {
				d.errorf(r.Line, "duplicate descriptor key %q without value (first at line %d)", r.Key, first)
			} else {
				d.errorf(r.Line, "duplicate descriptor key %q value %q (first at line %d)", r.Key, r.Value, first)
			}
			continue
		}
		seen[e] = r.Line
		out = append(out, r)
	}
	return out
}

// descriptor decodes one descriptor and what it nests.
func (d *decoder) descriptor(n *yaml.Node, p *parsedDomain, parent *Rule) *Rule {
	if n = d.visit(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, "descriptor: want a mapping with key, value, rate_limit and descriptors, got %s", describe(n))
		return nil
	}
	fs := d.fields(n, "descriptor", descriptorKeys)
	r := &Rule{File: d.file, Line: n.Line, Domain: p.name}
	ok := true
	if f, has := fs["key"]; !has {
		d.errorf(n.Line, "descriptor: missing key")
		ok = false
	} else if r.Key, ok = d.str(f); ok && r.Key == "" {
		d.errorf(f.val.Line, "key: must not be empty")
		ok = false
	}
	if f, has := fs["value"]; has {
		v, vok := d.str(f)
		r.Value, ok = v, ok && vok
	}
	r.glob = compileGlob(r.Value)
	for _, b := range []struct {
		name string
		dst  *bool
	}{
		{"shadow_mode", &r.ShadowMode}, {"detailed_metric", &r.DetailedMetric},
		{"value_to_metric", &r.ValueToMetric}, {"share_threshold", &r.ShareThreshold},
	} {
		if f, has := fs[b.name]; has {
			*b.dst = d.boolean(f)
		}
	}
	if f, has := fs["share_threshold"]; has && r.ShareThreshold && !r.Wildcard() {
		d.errorf(f.key.Line, "share_threshold: only a wildcard value (with *) can share its threshold")
	}

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

	one, hasOne := fs["rate_limit"]
	list, hasList := fs["rate_limits"]
	switch {
	case hasOne && hasList:
		d.errorf(list.key.Line, "descriptor: rate_limit and rate_limits together; put every limit in rate_limits")
	case hasOne:
		if l := d.rateLimit(one.val, "rate_limit", p); l != nil {
			r.Limits = []*Limit{l}
		}
	case hasList:
		r.Limits = d.rateLimits(list, p)
	}
	setIDs(r)
	if f, has := fs["descriptors"]; has {
		r.Descriptors = d.descriptors(f, p, r)
	}
	if !ok {
		return nil
	}
	return r
}

// rateLimits decodes a list of limits that all apply to one descriptor.
func (d *decoder) rateLimits(f field, p *parsedDomain) []*Limit {
	n := f.val
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "rate_limits: want a list of limits, got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n.Line, "rate_limits: empty; want one or more limits")
		return nil
	}
	var out []*Limit
	seen := map[sluice.Limit]int{}
	for _, c := range n.Content {
		l := d.rateLimit(c, "rate_limits", p)
		if l == nil {
			continue
		}
		if l.Unlimited && len(n.Content) > 1 {
			d.errorf(l.Line, "rate_limits: an unlimited limit cannot sit beside others")
			continue
		}
		if first, dup := seen[l.Limit]; dup && !l.Unlimited {
			d.errorf(l.Line, "rate_limits: the same limit twice (first at line %d)", first)
			continue
		}
		seen[l.Limit] = l.Line
		out = append(out, l)
	}
	return out
}

// rateLimit decodes one rate_limit block.
func (d *decoder) rateLimit(n *yaml.Node, what string, p *parsedDomain) *Limit {
	if n = d.visit(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, "%s: want a mapping with unit and requests_per_unit, got %s", what, describe(n))
		return nil
	}
	fs := d.fields(n, what, rateLimitKeys)
	nerr := len(*d.errs)
	l := &Limit{File: d.file, Line: n.Line}

	if f, ok := fs["name"]; ok {
		if l.Name, _ = d.str(f); l.Name != "" {
			p.names[l.Name] = true
		}
	}
	if f, ok := fs["replaces"]; ok {
		l.Replaces = d.replaces(f, l.Name, p)
	}
	if f, ok := fs["unlimited"]; ok {
		l.Unlimited = d.boolean(f)
	}
	if l.Unlimited {
		// Envoy's ratelimit rejects a unit beside unlimited and ignores
		// requests_per_unit; sluice's extensions make no sense there either.
		for _, k := range []string{"unit", "algorithm", "burst", "unit_multiplier", "throttling", "exceed_percent"} {
			if f, ok := fs[k]; ok {
				d.errorf(f.key.Line, "%s: not allowed with unlimited: true", k)
			}
		}
		if len(*d.errs) > nerr {
			return nil
		}
		return l
	}

	var period time.Duration
	unitLine := n.Line
	if f, ok := fs["unit"]; !ok {
		d.errorf(n.Line, "%s: missing unit (second, minute, hour, day, week, month or year)", what)
	} else if u, ok := d.str(f); ok {
		unitLine = f.val.Line
		l.Unit = strings.ToLower(u) // Envoy's ratelimit reads SECOND as second
		if period, ok = unitPeriod(l.Unit); !ok {
			d.errorf(f.val.Line, "unit: unknown unit %q (want second, minute, hour, day, week, month or year)", u)
		}
	}
	l.UnitMultiplier = 1
	if f, ok := fs["unit_multiplier"]; ok {
		if m, ok := d.integer(f); ok {
			switch {
			case m < 1:
				d.errorf(f.val.Line, "unit_multiplier: must be at least 1, got %d", m)
			case period > 0 && m > math.MaxInt64/int64(period):
				d.errorf(f.val.Line, "unit_multiplier: %d %ss is too long", m, l.Unit)
			default:
				l.UnitMultiplier = m
				unitLine = f.val.Line
			}
		}
	}
	l.Limit.Period = period * time.Duration(l.UnitMultiplier)

	rateLine := n.Line
	if f, ok := fs["requests_per_unit"]; !ok {
		d.errorf(n.Line, "%s: missing requests_per_unit", what)
	} else if v, ok := d.integer(f); ok {
		rateLine = f.val.Line
		if v < 1 {
			d.errorf(f.val.Line, "requests_per_unit: must be at least 1, got %d", v)
		}
		l.Limit.Rate = v
	}
	algLine := n.Line
	if f, ok := fs["algorithm"]; ok {
		if s, ok := d.str(f); ok {
			a, err := sluice.ParseAlgorithm(s)
			if err != nil {
				d.errorf(f.val.Line, "algorithm: %v", err)
			}
			l.Limit.Algorithm, algLine = a, f.val.Line
		}
	}
	burstLine := n.Line
	if f, ok := fs["burst"]; ok {
		if b, ok := d.integer(f); ok {
			if b < 1 {
				d.errorf(f.val.Line, "burst: must be at least 1, got %d", b)
			}
			l.Limit.Burst, burstLine = b, f.val.Line
		}
	}
	throttleLine := n.Line
	if f, ok := fs["throttling"]; ok {
		if s, ok := d.str(f); ok {
			switch s {
			case "hard":
				l.Throttling = Hard
			case "soft":
				l.Throttling = Soft
			default:
				d.errorf(f.val.Line, "throttling: want hard or soft, got %q", s)
			}
			throttleLine = f.val.Line
		}
	}
	if f, ok := fs["exceed_percent"]; ok {
		if v, ok := d.integer(f); ok {
			switch {
			case l.Throttling != Soft:
				d.errorf(f.key.Line, "exceed_percent: only with throttling: soft")
			case v < 1 || v > 1_000_000:
				d.errorf(f.val.Line, "exceed_percent: must be between 1 and 1000000, got %d", v)
			default:
				l.ExceedPercent = v
			}
		}
	} else if l.Throttling == Soft {
		d.errorf(throttleLine, "throttling: soft needs exceed_percent (how far past the limit to admit)")
	}
	if len(*d.errs) > nerr {
		return nil
	}
	if err := l.Limit.Validate(); err != nil {
		var fe *sluice.FieldError
		if errors.As(err, &fe) {
			switch fe.Field {
			case "Rate":
				d.errorf(rateLine, "requests_per_unit: %s", fe.Reason)
			case "Burst":
				d.errorf(burstLine, "burst: %s", fe.Reason)
			case "Period":
				d.errorf(unitLine, "unit: %s", fe.Reason)
			case "Algorithm":
				d.errorf(algLine, "algorithm: %s", fe.Reason)
			default:
				d.errorf(n.Line, "%s: %s", what, err)
			}
		} else {
			d.errorf(n.Line, "%s: %v", what, err)
		}
		return nil
	}
	if l.Throttling == Soft {
		if err := softLimit(l.Limit, l.ExceedPercent).Validate(); err != nil {
			d.errorf(throttleLine, "exceed_percent: %d%% past %s is too large: %v", l.ExceedPercent, l.Limit, err)
			return nil
		}
		if softLimit(l.Limit, l.ExceedPercent) == l.Limit {
			d.errorf(throttleLine, "exceed_percent: %d%% past %s admits nothing more (the excess rounds down to 0); raise exceed_percent", l.ExceedPercent, l.Limit)
			return nil
		}
	}
	return l
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

// replaces decodes Envoy's replaces: a list of {name: ...}.
func (d *decoder) replaces(f field, own string, p *parsedDomain) []string {
	n := f.val
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "replaces: want a list of {name: ...}, got %s", describe(n))
		return nil
	}
	var out []string
	for _, c := range n.Content {
		if c = d.visit(c); c == nil {
			return out
		}
		if c.Kind != yaml.MappingNode {
			d.errorf(c.Line, "replaces: want {name: ...}, got %s", describe(c))
			continue
		}
		nf, ok := d.fields(c, "replaces", replacesKeys)["name"]
		if !ok {
			d.errorf(c.Line, "replaces: missing name")
			continue
		}
		name, ok := d.str(nf)
		switch {
		case !ok:
		case name == "":
			d.errorf(nf.val.Line, "replaces: name must not be empty")
		case name == own:
			d.errorf(nf.val.Line, "replaces: a limit cannot replace itself (%q)", name)
		default:
			out = append(out, name)
			p.replaces = append(p.replaces, replaceRef{name, nf.val.Line})
		}
	}
	return out
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
// changing them keeps the count.
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
	if l.Unlimited {
		str("unlimited")
	} else {
		str(l.Limit.Algorithm.String())
		num(l.Limit.Period.Microseconds())
	}
	if nth > 0 {
		num(int64(nth))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
