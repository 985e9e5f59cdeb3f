// Package identity turns an HTTP request into the descriptors that sluice's
// rules match: the client's address (believing the one configured
// forwarding header only from trusted proxies, IPv6 grouped by prefix),
// request headers, claims of a
// verified bearer JWT, the path, the method and constants, configured as
// the rate_limits actions of an Envoy route.
package identity

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// Descriptor is one descriptor of a request: the entries its actions
// produced and the hits it adds, ready for a decide.Request.
type Descriptor = rules.Descriptor

// Identity produces descriptors from requests. Its configuration is
// immutable; it is safe for concurrent use.
type Identity struct {
	domain  string
	actions int // of all limits
	trusted []netip.Prefix
	fwdKind forwardedKind
	fwdName string // the canonical key of forwarded_header
	fwdAuth forwardAuth
	v4bits  int
	v6bits  int
	jwt     *verifier
	limits  []limit
	log     *slog.Logger

	untrusted   onceCounter // forwarding headers from untrusted peers
	otherHeader onceCounter // trusted peers naming clients in another header
}

// Option sets what an Identity needs beyond its Config.
type Option func(*Identity)

// WithLogger sets the logger of the warnings an Identity logs once, such as
// forwarding headers from a peer outside trusted_proxies. Default
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(id *Identity) {
		if l != nil {
			id.log = l
		}
	}
}

type limit struct {
	actions []action
	cost    int64
}

// outcome is what an action did with its descriptor.
type outcome uint8

const (
	produced outcome = iota // the entry is set
	skipped                 // no entry, the descriptor goes on
	dropped                 // the descriptor is not sent
)

// action produces one entry of a descriptor from a request.
type action interface {
	entry(rs *reqState) (rules.Entry, outcome)
	// needs tells the linter what a request needs for the action to
	// produce its entry, whether lacking it drops the descriptor, and
	// whether the action always produces.
	needs() (need string, drops, always bool)
}

// reqState holds what several actions of one request share, computed once.
type reqState struct {
	id        *Identity
	r         *http.Request
	client    string
	clientSet bool
	claims    map[string]any
	claimsSet bool
}

func (rs *reqState) clientKey() string {
	if !rs.clientSet {
		rs.clientSet = true
		if a := rs.id.ClientAddr(rs.r); a.IsValid() {
			rs.client = rs.id.group(a)
		}
	}
	return rs.client
}

func (rs *reqState) claim(name string) (string, bool) {
	if !rs.claimsSet {
		rs.claimsSet = true
		if rs.id.jwt != nil {
			rs.claims = rs.id.jwt.claims(rs.r)
		}
	}
	if rs.claims == nil {
		return "", false
	}
	return claimString(rs.claims[name])
}

// New compiles cfg. It returns a *ConfigError when cfg is not valid; now is
// the clock token expiry is checked against (nil: time.Now).
func New(cfg Config, now func() time.Time, opts ...Option) (*Identity, error) {
	id, err := compile(&cfg)
	if err != nil {
		return nil, err
	}
	if id.jwt != nil && now != nil {
		id.jwt.now = now
	}
	id.log = slog.Default()
	for _, o := range opts {
		o(id)
	}
	return id, nil
}

// Domain returns the rules domain of the descriptors.
func (id *Identity) Domain() string { return id.domain }

// Descriptors returns the descriptors of r: one per configured rate limit
// whose actions all produced (or skipped) their entry, in order.
func (id *Identity) Descriptors(r *http.Request) []Descriptor {
	rs := reqState{id: id, r: r}
	out := make([]Descriptor, 0, len(id.limits))
	// The entries of all descriptors share one array, each descriptor's
	// slice clipped to its own part of it.
	all := make([]rules.Entry, id.actions)
next:
	for _, l := range id.limits {
		entries := all[:0:len(l.actions)]
		all = all[len(l.actions):]
		for _, a := range l.actions {
			e, o := a.entry(&rs)
			switch o {
			case produced:
				entries = append(entries, e)
			case dropped:
				continue next
			}
		}
		if len(entries) > 0 {
			out = append(out, Descriptor{Entries: entries, Cost: l.cost})
		}
	}
	return out
}

func compile(c *Config) (*Identity, error) {
	if c.Domain == "" {
		return nil, fieldErr(errors.New("required"), "domain")
	}
	id := &Identity{domain: c.Domain, v4bits: c.IPv4Prefix, v6bits: c.IPv6Prefix}
	if id.v4bits == 0 {
		id.v4bits = 32
	}
	if id.v6bits == 0 {
		id.v6bits = 64
	}
	if id.v4bits < 1 || id.v4bits > 32 {
		return nil, fieldErr(fmt.Errorf("must be 1 to 32, got %d", c.IPv4Prefix), "ipv4_prefix")
	}
	if id.v6bits < 1 || id.v6bits > 128 {
		return nil, fieldErr(fmt.Errorf("must be 1 to 128, got %d", c.IPv6Prefix), "ipv6_prefix")
	}
	for i, s := range c.TrustedProxies {
		p, err := validCIDR(s)
		if err != nil {
			return nil, fieldErr(err, "trusted_proxies", i)
		}
		id.trusted = append(id.trusted, p)
	}
	kind, name, err := parseForwardedHeader(c.ForwardedHeader)
	if err != nil {
		return nil, fieldErr(err, "forwarded_header")
	}
	if c.ForwardedHeader != "" && len(c.TrustedProxies) == 0 {
		return nil, fieldErr(errors.New("set without trusted_proxies: no peer is trusted to set it"), "forwarded_header")
	}
	id.fwdKind, id.fwdName = kind, name
	if id.fwdAuth, err = parseForwardAuth(c.ForwardAuthHeaders); err != nil {
		return nil, fieldErr(err, "forward_auth_headers")
	}
	if c.JWT != nil {
		v, err := newVerifier(c.JWT)
		if err != nil {
			return nil, err
		}
		id.jwt = v
	}
	for i, rl := range c.RateLimits {
		if len(rl.Actions) == 0 {
			return nil, fieldErr(errors.New("at least one action is required"), "rate_limits", i, "actions")
		}
		if rl.Cost < 0 {
			return nil, fieldErr(fmt.Errorf("must not be negative, got %d", rl.Cost), "rate_limits", i, "cost")
		}
		l := limit{cost: rl.Cost}
		if l.cost == 0 {
			l.cost = 1
		}
		for j, a := range rl.Actions {
			ca, err := compileAction(&a)
			if err != nil {
				var ce *ConfigError
				if errors.As(err, &ce) {
					ce.path = append([]any{"rate_limits", i, "actions", j}, ce.path...)
					ce.Field = fieldErr(nil, ce.path...).Field
					return nil, ce
				}
				return nil, fieldErr(err, "rate_limits", i, "actions", j)
			}
			l.actions = append(l.actions, ca)
		}
		id.limits = append(id.limits, l)
		id.actions += len(l.actions)
	}
	return id, nil
}

func compileAction(a *Action) (action, error) {
	n := 0
	for _, set := range []bool{a.RemoteAddress != nil, a.RequestHeaders != nil, a.GenericKey != nil,
		a.HeaderValueMatch != nil, a.Path != nil, a.Method != nil, a.JWTClaim != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("want exactly one of remote_address, request_headers, generic_key, header_value_match, path, method, jwt_claim; got %d", n)
	}
	switch {
	case a.RemoteAddress != nil:
		return remoteAddress{key: or(a.RemoteAddress.DescriptorKey, "remote_address")}, nil
	case a.RequestHeaders != nil:
		h := a.RequestHeaders
		if h.HeaderName == "" {
			return nil, fieldErr(errors.New("required"), "request_headers", "header_name")
		}
		if h.DescriptorKey == "" {
			return nil, fieldErr(errors.New("required"), "request_headers", "descriptor_key")
		}
		return requestHeader{name: h.HeaderName, fallback: fallback{key: h.DescriptorKey, skip: h.SkipIfAbsent, def: h.DefaultValue}}, nil
	case a.GenericKey != nil:
		g := a.GenericKey
		if g.DescriptorValue == "" {
			return nil, fieldErr(errors.New("required"), "generic_key", "descriptor_value")
		}
		return constant{rules.Entry{Key: or(g.DescriptorKey, "generic_key"), Value: g.DescriptorValue}}, nil
	case a.HeaderValueMatch != nil:
		return compileHeaderMatch(a.HeaderValueMatch)
	case a.Path != nil:
		return compilePath(a.Path)
	case a.Method != nil:
		return method{key: or(a.Method.DescriptorKey, "method")}, nil
	default:
		c := a.JWTClaim
		if c.DescriptorKey == "" {
			return nil, fieldErr(errors.New("required"), "jwt_claim", "descriptor_key")
		}
		return jwtClaim{claim: or(c.Claim, "sub"), fallback: fallback{key: c.DescriptorKey, skip: c.SkipIfAbsent, def: c.DefaultValue}}, nil
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

type remoteAddress struct{ key string }

func (a remoteAddress) entry(rs *reqState) (rules.Entry, outcome) {
	v := rs.clientKey()
	if v == "" {
		return rules.Entry{}, dropped
	}
	return rules.Entry{Key: a.key, Value: v}, produced
}

// fallback is what a header or claim action does when its value is absent.
type fallback struct {
	key  string
	skip bool
	def  string
}

func (f fallback) result(v string, ok bool) (rules.Entry, outcome) {
	switch {
	case ok && v != "":
		return rules.Entry{Key: f.key, Value: v}, produced
	case f.def != "":
		return rules.Entry{Key: f.key, Value: f.def}, produced
	case f.skip:
		return rules.Entry{}, skipped
	}
	return rules.Entry{}, dropped
}

type requestHeader struct {
	name string
	fallback
}

func (a requestHeader) entry(rs *reqState) (rules.Entry, outcome) {
	return a.result(headerValue(rs.r, a.name))
}

// headerValue returns the first value of header name, or for Envoy's
// pseudo-headers :authority, :path and :method the request's host, URI and
// method.
func headerValue(r *http.Request, name string) (string, bool) {
	switch name {
	case ":authority":
		return r.Host, r.Host != ""
	case ":path":
		u := r.URL.RequestURI()
		return u, u != ""
	case ":method":
		return r.Method, r.Method != ""
	}
	vs := r.Header.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

type constant struct{ e rules.Entry }

func (a constant) entry(*reqState) (rules.Entry, outcome) { return a.e, produced }

type method struct{ key string }

func (a method) entry(rs *reqState) (rules.Entry, outcome) {
	return rules.Entry{Key: a.key, Value: rs.r.Method}, produced
}

type jwtClaim struct {
	claim string
	fallback
}

func (a jwtClaim) entry(rs *reqState) (rules.Entry, outcome) {
	return a.result(rs.claim(a.claim))
}

type headerMatch struct {
	e      rules.Entry
	expect bool
	match  []headerMatcher
}

type headerMatcher struct {
	name    string
	exact   string
	prefix  string
	re      *regexp.Regexp
	present *bool
	invert  bool
}

func compileHeaderMatch(h *HeaderValueMatch) (action, error) {
	if h.DescriptorValue == "" {
		return nil, fieldErr(errors.New("required"), "header_value_match", "descriptor_value")
	}
	if len(h.Headers) == 0 {
		return nil, fieldErr(errors.New("at least one header is required"), "header_value_match", "headers")
	}
	a := headerMatch{e: rules.Entry{Key: or(h.DescriptorKey, "header_match"), Value: h.DescriptorValue}, expect: true}
	if h.ExpectMatch != nil {
		a.expect = *h.ExpectMatch
	}
	for i, m := range h.Headers {
		if m.Name == "" {
			return nil, fieldErr(errors.New("required"), "header_value_match", "headers", i, "name")
		}
		n := 0
		for _, set := range []bool{m.ExactMatch != "", m.PrefixMatch != "", m.RegexMatch != "", m.PresentMatch != nil} {
			if set {
				n++
			}
		}
		if n > 1 {
			return nil, fieldErr(errors.New("want at most one of exact_match, prefix_match, regex_match, present_match"), "header_value_match", "headers", i)
		}
		hm := headerMatcher{name: m.Name, exact: m.ExactMatch, prefix: m.PrefixMatch, present: m.PresentMatch, invert: m.InvertMatch}
		if m.RegexMatch != "" {
			re, err := compileRegex(m.RegexMatch)
			if err != nil {
				return nil, fieldErr(err, "header_value_match", "headers", i, "regex_match")
			}
			hm.re = re
		}
		a.match = append(a.match, hm)
	}
	return a, nil
}

func (m headerMatcher) matches(r *http.Request) bool {
	v, ok := headerValue(r, m.name)
	var res bool
	switch {
	case m.present != nil:
		res = ok == *m.present
	case !ok:
		res = false
	case m.exact != "":
		res = v == m.exact
	case m.prefix != "":
		res = strings.HasPrefix(v, m.prefix)
	case m.re != nil:
		res = m.re.MatchString(v)
	default:
		res = true
	}
	return res != m.invert
}

func (a headerMatch) entry(rs *reqState) (rules.Entry, outcome) {
	all := true
	for _, m := range a.match {
		if !m.matches(rs.r) {
			all = false
			break
		}
	}
	if all != a.expect {
		return rules.Entry{}, dropped
	}
	return a.e, produced
}

// readKey returns the configured key text, from the config or its file.
func readKey(c *JWTConfig) ([]byte, error) {
	if c.Key != "" && c.KeyFile != "" {
		return nil, fieldErr(errors.New("set key or key_file, not both"), "jwt", "key_file")
	}
	if c.KeyFile != "" {
		b, err := os.ReadFile(c.KeyFile)
		if err != nil {
			return nil, fieldErr(fmt.Errorf("read key: %w", err), "jwt", "key_file")
		}
		return b, nil
	}
	if c.Key == "" {
		return nil, fieldErr(errors.New("key or key_file is required"), "jwt", "key")
	}
	return []byte(c.Key), nil
}
