package identity

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/yamlerr"
	"go.yaml.in/yaml/v3"
)

// Config says how to turn an HTTP request into descriptors. It is the YAML
// document
//
//	domain: api
//	trusted_proxies: [10.0.0.0/8, 127.0.0.1/32]
//	ipv6_prefix: 64
//	jwt: {algorithm: HS256, key: "secret"}
//	rate_limits:
//	  - actions:                        # one descriptor: remote_address=<ip>
//	      - remote_address: {}
//	  - actions:                        # one descriptor: user=<sub claim>
//	      - jwt_claim: {claim: sub, descriptor_key: user}
//
// modelled on the rate_limits of an Envoy route: each entry of RateLimits
// yields at most one descriptor, whose entries its actions produce in order.
type Config struct {
	// Domain is the rules domain the descriptors are matched in.
	Domain string `yaml:"domain"`
	// TrustedProxies are the CIDRs (or single addresses) of the proxies
	// whose ForwardedHeader is believed. Empty: the client is always the
	// connection's peer.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// ForwardedHeader is the one header the trusted proxies set to name
	// the client: X-Forwarded-For, Forwarded (RFC 7239's for= parameters)
	// or X-Real-IP (one address, which the proxy must replace, not pass
	// on). No other header is ever believed, so a client's own copy of
	// another one that a proxy passes through changes nothing. Empty means
	// X-Forwarded-For, what nginx's $proxy_add_x_forwarded_for, Traefik,
	// Caddy and most load balancers append. Case does not matter.
	ForwardedHeader string `yaml:"forwarded_header"`
	// ForwardAuthHeaders names the headers forward-auth (sluice serve's
	// GET /v1/auth) reads the request it is asked about from, and the only
	// ones: X-Original for nginx's auth_request (X-Original-Method,
	// X-Original-URI, which the nginx configuration sets), X-Forwarded for
	// Traefik's ForwardAuth and Caddy's forward_auth (X-Forwarded-Method,
	// X-Forwarded-Uri). Both take the host from X-Forwarded-Host and the
	// scheme from X-Forwarded-Proto. Empty: forward-auth refuses the file
	// (the proxy and the middleware do not use it). Case does not matter.
	ForwardAuthHeaders string `yaml:"forward_auth_headers"`
	// IPv4Prefix and IPv6Prefix group client addresses into networks: one
	// host often holds a whole IPv6 /64. Zero means the default, 32 and 64.
	IPv4Prefix int `yaml:"ipv4_prefix"`
	IPv6Prefix int `yaml:"ipv6_prefix"`
	// JWT verifies the bearer tokens that jwt_claim actions read. Nil: no
	// token is trusted, and jwt_claim actions always act as if absent.
	JWT *JWTConfig `yaml:"jwt"`
	// RateLimits lists the descriptors to produce.
	RateLimits []RateLimit `yaml:"rate_limits"`
}

// DefaultConfig returns the configuration of a proxy or middleware given
// no identity file: one descriptor per client address
// (remote_address=<ip>), IPv4 addresses whole, IPv6 grouped by /64, no
// trusted proxies. Domain is left for the caller to set.
func DefaultConfig() Config {
	return Config{
		IPv4Prefix: 32, // each IPv4 address on its own
		IPv6Prefix: 64, // one host often holds a whole /64
		RateLimits: []RateLimit{{Actions: []Action{{RemoteAddress: &RemoteAddress{}}}}},
	}
}

// JWTConfig is the key that bearer tokens must be signed with.
type JWTConfig struct {
	// Algorithm is HS256, RS256 or ES256; tokens signed otherwise are
	// rejected.
	Algorithm string `yaml:"algorithm"`
	// Key is the HS256 secret, or the PEM public key for RS256 and ES256.
	Key string `yaml:"key"`
	// KeyFile is a file holding Key instead.
	KeyFile string `yaml:"key_file"`
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// Require lists claims a token must carry to be believed, such as exp:
	// without it a token that has no exp is good for ever. Default none:
	// the signature is checked, and exp, nbf and iat when present. At most
	// 16 names.
	Require []string `yaml:"require"`
	// Leeway is the clock skew allowed to exp, nbf and iat: a token is
	// still believed Leeway after its exp, and already Leeway before its
	// nbf or iat; one issued further in the future is not. Zero means the
	// default, 30s; at most 10m, written with a unit ("45s").
	Leeway time.Duration `yaml:"leeway"`
}

// JWT defaults and bounds.
const (
	defaultLeeway = 30 * time.Second // clock skew between issuer and sluice
	maxLeeway     = 10 * time.Minute
	maxRequire    = 16  // claim names in Require
	maxClaimName  = 128 // bytes of one name
)

// RateLimit is one descriptor to produce, as an Envoy route's rate limit.
type RateLimit struct {
	// Actions produce the descriptor's entries, in order. If one produces
	// nothing (a missing header without skip_if_absent or default, a path
	// that does not match), the descriptor is not sent at all.
	Actions []Action `yaml:"actions"`
	// Cost is the hits the request adds to the descriptor's limits: 0 means
	// the default 1 (Envoy's hits_addend).
	Cost int64 `yaml:"cost"`
}

// Action produces one descriptor entry. Exactly one field is set.
type Action struct {
	RemoteAddress    *RemoteAddress    `yaml:"remote_address"`
	RequestHeaders   *RequestHeaders   `yaml:"request_headers"`
	GenericKey       *GenericKey       `yaml:"generic_key"`
	HeaderValueMatch *HeaderValueMatch `yaml:"header_value_match"`
	Path             *PathAction       `yaml:"path"`
	Method           *MethodAction     `yaml:"method"`
	JWTClaim         *JWTClaim         `yaml:"jwt_claim"`
}

// RemoteAddress yields the client's address grouped by the configured
// prefix: "remote_address"="203.0.113.7" or "2001:db8:1:2::/64".
type RemoteAddress struct {
	// DescriptorKey defaults to "remote_address".
	DescriptorKey string `yaml:"descriptor_key"`
}

// RequestHeaders yields DescriptorKey=the value of HeaderName.
type RequestHeaders struct {
	HeaderName    string `yaml:"header_name"`
	DescriptorKey string `yaml:"descriptor_key"`
	// SkipIfAbsent leaves the entry out, keeping the rest of the descriptor,
	// when the header is missing; otherwise the descriptor is dropped.
	SkipIfAbsent bool `yaml:"skip_if_absent"`
	// DefaultValue, when set, is the value used when the header is missing.
	DefaultValue string `yaml:"default_value"`
}

// GenericKey yields DescriptorKey=DescriptorValue, a constant.
type GenericKey struct {
	// DescriptorKey defaults to "generic_key".
	DescriptorKey   string `yaml:"descriptor_key"`
	DescriptorValue string `yaml:"descriptor_value"`
}

// HeaderValueMatch yields DescriptorKey=DescriptorValue when the request's
// headers match all of Headers (or, with expect_match false, when they do
// not), and drops the descriptor otherwise.
type HeaderValueMatch struct {
	// DescriptorKey defaults to "header_match".
	DescriptorKey   string `yaml:"descriptor_key"`
	DescriptorValue string `yaml:"descriptor_value"`
	// ExpectMatch defaults to true.
	ExpectMatch *bool           `yaml:"expect_match"`
	Headers     []HeaderMatcher `yaml:"headers"`
}

// HeaderMatcher matches one header; with no match field set it matches when
// the header is present.
type HeaderMatcher struct {
	Name        string `yaml:"name"`
	ExactMatch  string `yaml:"exact_match"`
	PrefixMatch string `yaml:"prefix_match"`
	RegexMatch  string `yaml:"regex_match"`
	// PresentMatch false matches when the header is absent.
	PresentMatch *bool `yaml:"present_match"`
	// InvertMatch negates the result.
	InvertMatch bool `yaml:"invert_match"`
}

// PathAction yields DescriptorKey=the request path, or DescriptorValue when
// set, if the path matches Exact, Prefix or Regex (at most one; none
// matches every path). A path that does not match drops the descriptor.
// The path is matched and produced normalised: decoded once, ;parameters,
// trailing spaces and control characters of each segment removed,
// backslashes read as slashes, dot segments, repeated and trailing slashes
// resolved, so /login;jsessionid=1, /login%20, /a/../login and //login/
// all meet a limit on /login. Exact must be written normalised (an error
// says so otherwise).
type PathAction struct {
	// DescriptorKey defaults to "path".
	DescriptorKey   string `yaml:"descriptor_key"`
	DescriptorValue string `yaml:"descriptor_value"`
	Exact           string `yaml:"exact"`
	Prefix          string `yaml:"prefix"`
	Regex           string `yaml:"regex"`
	// IgnoreCase matches the path in lowercase (Exact and Prefix are
	// lowercased, Regex matches case-insensitively) and produces it in
	// lowercase, so /Login and /login share one limit. Default false: case
	// matters, as it does to most servers' routing.
	IgnoreCase bool `yaml:"ignore_case"`
}

// MethodAction yields DescriptorKey=the request method.
type MethodAction struct {
	// DescriptorKey defaults to "method".
	DescriptorKey string `yaml:"descriptor_key"`
}

// JWTClaim yields DescriptorKey=the claim of the request's bearer token,
// if the token verifies with the configured key. A missing, unverifiable,
// expired or forged token counts as absent, as with RequestHeaders.
type JWTClaim struct {
	// Claim defaults to "sub".
	Claim         string `yaml:"claim"`
	DescriptorKey string `yaml:"descriptor_key"`
	SkipIfAbsent  bool   `yaml:"skip_if_absent"`
	DefaultValue  string `yaml:"default_value"`
}

// ConfigError is a mistake in an identity configuration, located in its
// file.
type ConfigError struct {
	File  string // "" when the config did not come from a file
	Line  int    // 0 when unknown
	Field string // such as "rate_limits[0].actions[1].path.regex"
	Err   error

	path []any // Field as map keys and indexes, to find Line
}

func (e *ConfigError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if loc != "" {
		loc += ": "
	}
	if e.Field != "" {
		return loc + e.Field + ": " + e.Err.Error()
	}
	return loc + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// MaxFileBytes is the largest identity file Load reads: 1 MiB, hundreds of
// times a real one. A larger file is refused before it is parsed.
const MaxFileBytes = 1 << 20

// Load reads and validates the identity configuration in the YAML file at
// path, refusing one above MaxFileBytes.
func Load(path string) (Config, error) {
	data, err := readFile(path)
	if err != nil {
		return Config{}, err
	}
	return Parse(path, data)
}

// readFile reads the file at path, up to MaxFileBytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load identity config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load identity config: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, &ConfigError{File: path, Err: fmt.Errorf("too large: more than %d bytes", MaxFileBytes)}
	}
	return data, nil
}

// Parse decodes the YAML document data strictly (unknown fields are errors)
// and validates it; file names the document in errors. Errors are
// *ConfigError with the line of the mistake.
func Parse(file string, data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			return Config{}, &ConfigError{File: file, Line: lineOfYAMLError(te.Errors[0]), Err: errors.New(stripLine(te.Errors[0]))}
		}
		line, msg := yamlerr.Locate(data, err)
		return Config{}, &ConfigError{File: file, Line: line, Err: errors.New(msg)}
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, &ConfigError{File: file, Err: err}
	}
	if err := c.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = file
			ce.Line = lineOf(&root, ce.path)
		}
		return Config{}, err
	}
	return c, nil
}

// lineOfYAMLError returns the line yaml.v3 puts at the start of its
// messages ("line 7: field foo not found in type ..."), or 0.
func lineOfYAMLError(msg string) int {
	var n int
	if _, err := fmt.Sscanf(msg, "line %d:", &n); err != nil {
		return 0
	}
	return n
}

// stripLine removes yaml.v3's "line N: " prefix.
func stripLine(msg string) string {
	for i := 0; i+1 < len(msg); i++ {
		if msg[i] == ':' && msg[i+1] == ' ' {
			if lineOfYAMLError(msg) > 0 {
				return msg[i+2:]
			}
			break
		}
	}
	return msg
}

// lineOf follows path (map keys and sequence indexes) from the document
// root and returns the line of the node it reaches, or of the deepest node
// on the way.
func lineOf(root *yaml.Node, path []any) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, p := range path {
		var next *yaml.Node
		switch p := p.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == p {
						next = n.Content[i+1]
						line = n.Content[i].Line
						break
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && p < len(n.Content) {
				next = n.Content[p]
				line = next.Line
			}
		}
		if next == nil {
			break
		}
		n = next
	}
	return line
}

// fieldErr builds a ConfigError for the field at path.
func fieldErr(err error, path ...any) *ConfigError {
	var b []byte
	for _, p := range path {
		switch p := p.(type) {
		case string:
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, p...)
		case int:
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(p), 10)
			b = append(b, ']')
		}
	}
	return &ConfigError{Field: string(b), Err: err, path: path}
}

// Validate reports the first mistake in c as a *ConfigError: a missing
// domain, a bad CIDR or prefix length, a bad JWT algorithm or key, an
// action with no or several kinds set, a bad regular expression, or a
// missing header name.
func (c *Config) Validate() error {
	_, err := compile(c)
	return err
}

func validCIDR(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func compileRegex(s string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("bad regex: %w", err)
	}
	return re, nil
}
