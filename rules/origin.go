package rules

// Origin says where a Set came from, for those who show it (GET /v1/rules,
// /rlconfig, the dashboard): a source that is not files, such as an xDS
// management server.
type Origin struct {
	// Source names it: "xds://controller:18001", say.
	Source string `json:"source"`
	// Version is the version the source gave the rules: for xDS, the
	// version acknowledged.
	Version string `json:"version,omitempty"`
}

// WithOrigin returns a Set with s's rules that says it came from o. s is
// unchanged; the two share their rules.
func (s *Set) WithOrigin(o Origin) *Set {
	c := &Set{}
	if s != nil {
		*c = *s
	}
	c.origin = &o
	return c
}

// Origin returns where s came from, or nil when it says nothing (rules
// files, a rules database).
func (s *Set) Origin() *Origin {
	if s == nil || s.origin == nil {
		return nil
	}
	o := *s.origin
	return &o
}
