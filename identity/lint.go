package identity

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LintFile reads the identity file at path as Load does and returns it
// with its warnings: settings that are valid but leave a way around the
// limits. Each warning is a *ConfigError with the file, line and field it
// is about.
func LintFile(path string) (Config, []*ConfigError, error) {
	data, err := readFile(path)
	if err != nil {
		return Config{}, nil, err
	}
	return Lint(path, data)
}

// Lint parses data as Parse does and returns it with its warnings (see
// LintFile), or Parse's error.
func Lint(file string, data []byte) (Config, []*ConfigError, error) {
	c, err := Parse(file, data)
	if err != nil {
		return Config{}, nil, err
	}
	id, err := compile(&c)
	if err != nil {
		return Config{}, nil, err // Parse validated c: not reached
	}
	ws := id.lint(&c)
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, nil, &ConfigError{File: file, Err: err}
	}
	for _, w := range ws {
		w.File, w.Line = file, lineOf(&root, w.path)
	}
	return c, ws, nil
}

// lint returns the warnings about the compiled id of c.
func (id *Identity) lint(c *Config) []*ConfigError {
	var ws []*ConfigError
	// A request that yields no descriptor is not limited at all.
	var why []string
	always := false
	for i, l := range id.limits {
		if ok, reason := l.alwaysSent(); ok {
			always = true
			break
		} else {
			why = append(why, fmt.Sprintf("rate_limits[%d] needs %s", i, reason))
		}
	}
	switch {
	case len(id.limits) == 0:
		ws = append(ws, fieldErr(errors.New("no rate_limits: no request is limited"), "rate_limits"))
	case !always:
		ws = append(ws, fieldErr(fmt.Errorf("a request can yield no descriptor and pass unlimited (%s): "+
			"keep a limit every request meets, such as - actions: [{remote_address: {}}]", strings.Join(why, "; ")), "rate_limits"))
	}
	for i, p := range id.trusted {
		if p.Bits() == 0 {
			ws = append(ws, fieldErr(fmt.Errorf("%s trusts every peer: any client can name its own address in %s", p, id.fwdName), "trusted_proxies", i))
		}
	}
	if c.JWT != nil && !contains(c.JWT.Require, "exp") {
		ws = append(ws, fieldErr(errors.New("tokens without exp are believed for ever: add exp to require"), "jwt", "require"))
	}
	if c.JWT == nil {
		for i, l := range c.RateLimits {
			for j, a := range l.Actions {
				if a.JWTClaim != nil {
					ws = append(ws, fieldErr(errors.New("no jwt key is configured, so no token is believed and this claim is always absent"), "rate_limits", i, "actions", j, "jwt_claim"))
				}
			}
		}
	}
	if id.fwdAuth.family == "" {
		ws = append(ws, fieldErr(errors.New("not set: forward-auth (sluice serve --identity) refuses the file; "+
			"set X-Original for nginx, X-Forwarded for Traefik and Caddy (the proxy and the middleware do not use it)"), "forward_auth_headers"))
	}
	return ws
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// alwaysSent reports whether every request yields l's descriptor: no
// action can drop it and one always produces an entry. Otherwise reason
// says what a request needs for the descriptor to be sent.
func (l limit) alwaysSent() (bool, string) {
	produces := false
	for _, a := range l.actions {
		need, drops, always := a.needs()
		if drops {
			return false, need
		}
		produces = produces || always
	}
	if !produces {
		return false, "one of its skip_if_absent values"
	}
	return true, ""
}

// A peer without an IP address (a Unix socket) is not a case sluice's
// listeners meet.
func (remoteAddress) needs() (string, bool, bool) { return "", false, true }
func (constant) needs() (string, bool, bool)      { return "", false, true }
func (method) needs() (string, bool, bool)        { return "", false, true }

func (a requestHeader) needs() (string, bool, bool) {
	return a.fallback.needs("header " + a.name)
}

func (a jwtClaim) needs() (string, bool, bool) {
	return a.fallback.needs("a verified token with claim " + a.claim)
}

func (f fallback) needs(what string) (string, bool, bool) {
	switch {
	case f.def != "":
		return "", false, true
	case f.skip:
		return what, false, false
	}
	return what, true, false
}

func (a headerMatch) needs() (string, bool, bool) {
	if !a.expect {
		return "headers that do not match header_value_match " + a.e.Value, true, false
	}
	return "headers that match header_value_match " + a.e.Value, true, false
}

func (a pathMatch) needs() (string, bool, bool) {
	switch {
	case a.exact != "":
		return "path " + a.exact, true, false
	case a.prefix != "":
		return "a path under " + a.prefix, true, false
	case a.re != nil:
		return "a path matching " + a.re.String(), true, false
	}
	return "", false, true
}
