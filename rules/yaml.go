package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/yamlerr"
	"go.yaml.in/yaml/v3"
)

// This file is the YAML plumbing of rules files: it decodes a file's
// documents strictly (unknown and repeated keys, wrong types, missing keys,
// too many nodes) into DomainSpecs and records where each spec and field
// is, so that the schema's validation (schema.go), which Go values go
// through too, reports its mistakes at file:line.

// maxNodes bounds the YAML nodes one file may expand to, aliases followed,
// so that a file of nested aliases (a "billion laughs") cannot exhaust
// memory or time.
const maxNodes = 1 << 20

// Keys allowed in each kind of mapping.
var (
	domainKeys     = []string{"domain", "descriptors", "capacity"}
	descriptorKeys = []string{"key", "value", "rate_limit", "rate_limits", "descriptors",
		"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata",
		"concurrency", "priority"}
	rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "unit_multiplier", "throttling", "exceed_percent", "sync", "elastic_percent", "scope", "precision"}
	replacesKeys = []string{"name"}
)

// source is one rules file's name and contents.
type source struct {
	name string
	data []byte
}

// decoder decodes the documents of one file into specs, reporting the
// mistakes that are the YAML's and placing every spec in spots.
type decoder struct {
	rp     *report
	spots  map[any]*spot
	budget int // nodes left to visit before the file counts as too large
}

// decodeFile decodes every YAML document of src into one DomainSpec each,
// and returns them with the checker that validates them at their lines.
func decodeFile(src source, errs *Errors) ([]*DomainSpec, *checker) {
	d := &decoder{rp: &report{file: src.name, errs: errs}, spots: map[any]*spot{}, budget: maxNodes}
	dec := yaml.NewDecoder(bytes.NewReader(src.data))
	var out []*DomainSpec
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, msg := yamlerr.Locate(src.data, err)
			d.errorf(line, "%s", msg)
			return nil, nil
		}
		if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
			continue // an empty document, such as a trailing ---
		}
		if ds := d.domain(doc.Content[0]); ds != nil {
			out = append(out, ds)
		}
		if d.rp.over {
			break
		}
	}
	if len(out) == 0 && d.rp.n == 0 {
		d.errorf(0, "no domain: the file is empty")
	}
	return out, &checker{rp: d.rp, spots: d.spots, budget: maxRules}
}

// errorf reports a mistake at line of the file.
func (d *decoder) errorf(line int, format string, args ...any) {
	d.rp.add(line, "", fmt.Sprintf(format, args...))
}

// visit resolves aliases and charges one node against the budget; it
// returns nil once the file has expanded past maxNodes or has too many
// mistakes.
func (d *decoder) visit(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if d.rp.over {
		return nil
	}
	d.budget--
	if d.budget < 0 {
		line := 0
		if n != nil {
			line = n.Line
		}
		d.errorf(line, "too large: the file expands to more than %d YAML nodes", maxNodes)
		d.rp.over = true
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

// mapping is one decoded mapping: its fields and its spot.
type mapping struct {
	fs map[string]field
	sp *spot
}

// fields returns the keys of mapping n that are in allowed, reporting
// unknown and repeated keys, and records their lines in a new spot. Merge
// keys (<<: *anchor) are expanded; keys written out override merged ones.
// what names the mapping in messages.
func (d *decoder) fields(n *yaml.Node, what string, allowed []string) mapping {
	sp := &spot{line: n.Line, keys: make(map[string][2]int, len(n.Content)/2)}
	m := mapping{fs: d.collect(n, what, allowed, sp), sp: sp}
	for name, f := range m.fs {
		sp.keys[name] = [2]int{f.key.Line, f.val.Line}
	}
	return m
}

func (d *decoder) collect(n *yaml.Node, what string, allowed []string, sp *spot) map[string]field {
	out := make(map[string]field, len(n.Content)/2)
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.visit(n.Content[i]), d.visit(n.Content[i+1])
		if k == nil || v == nil {
			return out
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k.Line, "%s: want a key, got %s", what, describe(k))
			sp.broken = true
			continue
		}
		if k.ShortTag() == "!!merge" {
			merged = append(merged, v)
			continue
		}
		if first, dup := out[k.Value]; dup {
			d.errorf(k.Line, "%s: duplicate key %q (first at line %d)", what, k.Value, first.key.Line)
			sp.broken = true
			continue
		}
		if !contains(allowed, k.Value) {
			d.errorf(k.Line, "%s: unknown key %q (want %s)", what, k.Value, strings.Join(allowed, ", "))
			sp.broken = true
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
				sp.broken = true
				continue
			}
			for name, f := range d.collect(mm, what, allowed, sp) {
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

// str reads field name of m as text, as Envoy's YAML decoder does for its
// string fields (value: 200 is the string "200"), into dst. A mapping, a
// list or nothing is reported and marks the field bad.
func (d *decoder) str(m mapping, name string, dst *string) {
	f, ok := m.fs[name]
	if !ok {
		return
	}
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() == "!!null" {
		d.errorf(f.val.Line, "%s: want a string, got %s", name, describe(f.val))
		m.sp.markBad(name)
		return
	}
	*dst = f.val.Value
}

// boolean reads field name of m as true or false, and, unquoted, YAML
// 1.1's yes, no, on and off, which Envoy's YAML decoder reads as booleans
// too.
func (d *decoder) boolean(m mapping, name string, dst *bool) {
	f, ok := m.fs[name]
	if !ok {
		return
	}
	n := f.val
	if n.Kind == yaml.ScalarNode && n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
		switch n.Value {
		case "yes", "Yes", "YES", "on", "On", "ON":
			*dst = true
			return
		case "no", "No", "NO", "off", "Off", "OFF":
			*dst = false
			return
		}
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		d.errorf(n.Line, "%s: want true or false, got %s", name, describe(n))
		m.sp.markBad(name)
		return
	}
	*dst = b
}

// integer reads field name of m as a whole number. With positive, an
// explicit 0 is refused: the schema reads 0 as "the default", which a
// file states by leaving the field out.
func (d *decoder) integer(m mapping, name string, dst *int64, positive string) {
	f, ok := m.fs[name]
	if !ok {
		return
	}
	if v, ok := d.int64(f, name, positive); ok {
		*dst = v
	} else {
		m.sp.markBad(name)
	}
}

// int64 reads f as a whole number, reporting why it is not one.
func (d *decoder) int64(f field, name, positive string) (int64, bool) {
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() != "!!int" && isDigits(strings.TrimLeft(f.val.Value, "+-")) {
		d.errorf(f.val.Line, "%s: %s is out of range", name, f.val.Value)
		return 0, false
	}
	if f.val.Kind != yaml.ScalarNode || f.val.ShortTag() != "!!int" {
		d.errorf(f.val.Line, "%s: want a whole number, got %s", name, describe(f.val))
		return 0, false
	}
	var v int64
	if err := f.val.Decode(&v); err != nil {
		d.errorf(f.val.Line, "%s: %s is out of range", name, f.val.Value)
		return 0, false
	}
	if v == 0 && positive != "" {
		d.errorf(f.val.Line, "%s: %s, got 0", name, positive)
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
func (d *decoder) domain(n *yaml.Node) *DomainSpec {
	if n = d.visit(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, "want a mapping with domain and descriptors, got %s", describe(n))
		return nil
	}
	m := d.fields(n, "rules file", domainKeys)
	ds := &DomainSpec{}
	d.spots[ds] = m.sp
	if _, ok := m.fs["domain"]; !ok {
		d.errorf(n.Line, "missing domain")
		m.sp.markBad("domain")
	}
	d.str(m, "domain", &ds.Domain)
	if f, ok := m.fs["descriptors"]; ok {
		ds.Descriptors = d.descriptors(f, m, "descriptors")
	}
	if f, has := m.fs["capacity"]; has {
		if c := d.visit(f.val); c != nil {
			if ls := d.rateLimit(c, "capacity"); ls != nil {
				ds.Capacity = ls
			} else {
				m.sp.markBad("capacity")
			}
		}
	}
	return ds
}

// descriptors decodes a list of descriptors.
func (d *decoder) descriptors(f field, owner mapping, name string) []DescriptorSpec {
	n := f.val
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "descriptors: want a list of descriptors, got %s", describe(n))
		owner.sp.markBad(name)
		return nil
	}
	out := make([]DescriptorSpec, 0, len(n.Content)) // never grows: spots key on its elements
	for _, c := range n.Content {
		if c = d.visit(c); c == nil {
			break
		}
		if c.Kind != yaml.MappingNode {
			d.errorf(c.Line, "descriptor: want a mapping with key, value, rate_limit and descriptors, got %s", describe(c))
			continue
		}
		out = append(out, DescriptorSpec{})
		d.descriptor(c, &out[len(out)-1])
	}
	return out
}

// descriptor decodes one descriptor and what it nests into ds.
func (d *decoder) descriptor(n *yaml.Node, ds *DescriptorSpec) {
	m := d.fields(n, "descriptor", descriptorKeys)
	d.spots[ds] = m.sp
	if _, has := m.fs["key"]; !has {
		d.errorf(n.Line, "descriptor: missing key")
		m.sp.markBad("key")
	}
	d.str(m, "key", &ds.Key)
	d.str(m, "value", &ds.Value)
	d.boolean(m, "shadow_mode", &ds.ShadowMode)
	d.boolean(m, "quota_mode", &ds.QuotaMode)
	d.boolean(m, "detailed_metric", &ds.DetailedMetric)
	d.boolean(m, "value_to_metric", &ds.ValueToMetric)
	d.boolean(m, "share_threshold", &ds.ShareThreshold)
	d.integer(m, "concurrency", &ds.Concurrency, "must be at least 1")
	d.str(m, "priority", &ds.Priority)
	if f, has := m.fs["metadata"]; has {
		ds.Metadata = d.metadata(f, m)
	}
	if f, has := m.fs["rate_limit"]; has {
		if c := d.visit(f.val); c != nil {
			if ls := d.rateLimit(c, "rate_limit"); ls != nil {
				ds.RateLimit = ls
			} else {
				m.sp.markBad("rate_limit")
			}
		}
	}
	if f, has := m.fs["rate_limits"]; has {
		ds.RateLimits = d.rateLimits(f, m)
	}
	if f, has := m.fs["descriptors"]; has {
		ds.Descriptors = d.descriptors(f, m, "descriptors")
	}
}

// metadata decodes Envoy's metadata: a mapping of any data.
func (d *decoder) metadata(f field, owner mapping) map[string]any {
	if f.val.Kind == yaml.ScalarNode && f.val.ShortTag() == "!!null" {
		return nil
	}
	if f.val.Kind != yaml.MappingNode {
		d.errorf(f.val.Line, "metadata: want a mapping, got %s", describe(f.val))
		owner.sp.markBad("metadata")
		return nil
	}
	v, ok := d.data(f.val, 0)
	if !ok {
		owner.sp.markBad("metadata")
		return nil
	}
	return v.(map[string]any)
}

// data decodes any YAML node as JSON-like data: maps with string keys,
// lists, strings, int64s, float64s, booleans and nil; every node is
// charged to the budget.
func (d *decoder) data(n *yaml.Node, depth int) (any, bool) {
	if n = d.visit(n); n == nil {
		return nil, false
	}
	if depth > maxDataDepth {
		d.errorf(n.Line, "metadata: nested more than %d deep", maxDataDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := d.visit(n.Content[i])
			if k == nil {
				return nil, false
			}
			if k.Kind != yaml.ScalarNode {
				d.errorf(k.Line, "metadata: want a key, got %s", describe(k))
				return nil, false
			}
			v, ok := d.data(n.Content[i+1], depth+1)
			if !ok {
				return nil, false
			}
			out[k.Value] = v
		}
		return out, true
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, ok := d.data(c, depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, true
			}
		case "!!int":
			var i int64
			if err := n.Decode(&i); err == nil {
				return i, true
			}
			var f float64
			if err := n.Decode(&f); err == nil {
				return f, true
			}
		case "!!float":
			var f float64
			if err := n.Decode(&f); err == nil {
				if err := checkJSONData(f, 0); err != nil {
					d.errorf(n.Line, "metadata: %v", err)
					return nil, false
				}
				return f, true
			}
		}
		return n.Value, true
	}
	d.errorf(n.Line, "metadata: want data, got %s", describe(n))
	return nil, false
}

// rateLimits decodes a list of limits.
func (d *decoder) rateLimits(f field, owner mapping) []RateLimitSpec {
	n := f.val
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "rate_limits: want a list of limits, got %s", describe(n))
		owner.sp.markBad("rate_limits")
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n.Line, "rate_limits: empty; want one or more limits")
		owner.sp.markBad("rate_limits")
		return nil
	}
	out := make([]RateLimitSpec, 0, len(n.Content)) // never grows: spots key on its elements
	for _, c := range n.Content {
		if c = d.visit(c); c == nil {
			break
		}
		if c.Kind != yaml.MappingNode {
			d.errorf(c.Line, "rate_limits: want a mapping with unit and requests_per_unit, got %s", describe(c))
			continue
		}
		out = append(out, RateLimitSpec{})
		d.rateLimitInto(c, "rate_limits", &out[len(out)-1])
	}
	return out
}

// rateLimit decodes one rate_limit mapping; nil if it is not one.
func (d *decoder) rateLimit(n *yaml.Node, what string) *RateLimitSpec {
	if n.Kind != yaml.MappingNode {
		d.errorf(n.Line, "%s: want a mapping with unit and requests_per_unit, got %s", what, describe(n))
		return nil
	}
	ls := &RateLimitSpec{}
	d.rateLimitInto(n, what, ls)
	return ls
}

// rateLimitInto decodes one limit's mapping into ls.
func (d *decoder) rateLimitInto(n *yaml.Node, what string, ls *RateLimitSpec) {
	m := d.fields(n, what, rateLimitKeys)
	d.spots[ls] = m.sp
	d.str(m, "name", &ls.Name)
	if f, ok := m.fs["replaces"]; ok {
		ls.Replaces = d.replaces(f, m)
	}
	d.boolean(m, "unlimited", &ls.Unlimited)
	d.str(m, "unit", &ls.Unit)
	d.integer(m, "unit_multiplier", &ls.UnitMultiplier, "must be at least 1")
	d.integer(m, "requests_per_unit", &ls.RequestsPerUnit, "")
	d.str(m, "algorithm", &ls.Algorithm)
	d.integer(m, "burst", &ls.Burst, "must be at least 1")
	d.integer(m, "precision", &ls.Precision, "must be between 1 and 60")
	d.str(m, "throttling", &ls.Throttling)
	d.integer(m, "exceed_percent", &ls.ExceedPercent, "must be between 1 and 1000000")
	d.str(m, "sync", &ls.Sync)
	d.str(m, "scope", &ls.Scope)
	d.integer(m, "elastic_percent", &ls.ElasticPercent, "must be between 1 and 1000000")
	if _, ok := m.fs["requests_per_unit"]; !ok && !ls.Unlimited {
		// Envoy reads a missing requests_per_unit as 0, denying every
		// request; here it must be written out.
		d.errorf(n.Line, "%s: missing requests_per_unit", what)
		m.sp.markBad("requests_per_unit")
	}
}

// replaces decodes Envoy's replaces: a list of {name: ...}.
func (d *decoder) replaces(f field, owner mapping) []ReplaceSpec {
	n := f.val
	if n.Kind != yaml.SequenceNode {
		d.errorf(n.Line, "replaces: want a list of {name: ...}, got %s", describe(n))
		owner.sp.markBad("replaces")
		return nil
	}
	out := make([]ReplaceSpec, 0, len(n.Content)) // never grows: spots key on its elements
	for _, c := range n.Content {
		if c = d.visit(c); c == nil {
			break
		}
		if c.Kind != yaml.MappingNode {
			d.errorf(c.Line, "replaces: want {name: ...}, got %s", describe(c))
			continue
		}
		m := d.fields(c, "replaces", replacesKeys)
		out = append(out, ReplaceSpec{})
		rs := &out[len(out)-1]
		d.spots[rs] = m.sp
		if _, ok := m.fs["name"]; !ok {
			d.errorf(c.Line, "replaces: missing name")
			m.sp.markBad("name")
			continue
		}
		d.str(m, "name", &rs.Name)
	}
	return out
}
