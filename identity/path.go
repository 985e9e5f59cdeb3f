package identity

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/rules"
)

// normalizePath returns the form of the decoded request path p that path
// actions match, so that the spellings of one path that servers route to
// the same handler meet the same limits:
//
//   - a backslash counts as a slash (IIS and some frameworks treat it so);
//   - each segment loses its ;parameters (/login;jsessionid=1 is /login,
//     as in Tomcat and Jetty) and its trailing spaces and control
//     characters (/login%20, /login%00);
//   - dot segments are resolved and repeated and trailing slashes removed
//     (path.Clean: /a/../login, //login and /login/ are /login);
//   - bytes that are not UTF-8 become U+FFFD.
//
// p is decoded once by the caller (net/http does), so %2F and %3B count
// as / and ; and a doubly encoded %2520 stays %20; its fragment is cut
// off before (requestPath, parseURI). Case is kept; Unicode forms (NFC,
// full-width letters), trailing dots and the query are not touched. The
// result starts with a slash.
func normalizePath(p string) string {
	if isNormal(p) {
		return p
	}
	return normalizeSlow(p)
}

// normalizeSlow is normalizePath without the shortcut for normal paths.
func normalizeSlow(p string) string {
	b := make([]byte, 0, len(p)+1)
	b = append(b, '/')
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		seg = strings.TrimRightFunc(seg, func(r rune) bool { return r <= ' ' || r == 0x7f })
		b = append(b, seg...)
		b = append(b, '/')
	}
	q := path.Clean(string(b))
	if !utf8.ValidString(q) {
		q = strings.ToValidUTF8(q, "\uFFFD")
	}
	return q
}

// isNormal reports whether normalizePath would return p unchanged, without
// allocating: the common case of a plain path.
func isNormal(p string) bool {
	if p == "" || p[0] != '/' || (len(p) > 1 && p[len(p)-1] == '/') {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c <= ' ', c == 0x7f, c >= 0x80, c == '\\', c == ';':
			return false
		case c == '/' && i+1 < len(p) && (p[i+1] == '/' || p[i+1] == '.'):
			return false // "//", and "/." which may begin a dot segment
		}
	}
	return true
}

type pathMatch struct {
	key    string
	value  string
	exact  string
	prefix string
	re     *regexp.Regexp
	fold   bool // ignore_case: match and produce the lowercase path
}

func compilePath(p *PathAction) (action, error) {
	n := 0
	for _, s := range []string{p.Exact, p.Prefix, p.Regex} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return nil, fieldErr(errors.New("want at most one of exact, prefix, regex"), "path")
	}
	a := pathMatch{key: or(p.DescriptorKey, "path"), value: p.DescriptorValue, exact: p.Exact, prefix: p.Prefix, fold: p.IgnoreCase}
	if a.fold {
		a.exact, a.prefix = strings.ToLower(a.exact), strings.ToLower(a.prefix)
	}
	if a.exact != "" {
		if n := normalizePath(a.exact); n != a.exact {
			return nil, fieldErr(fmt.Errorf("%q is never matched: paths are matched normalised, write %q", p.Exact, n), "path", "exact")
		}
	}
	if a.prefix != "" {
		// A prefix may end in a slash; the rest must be normal.
		if n := strings.TrimSuffix(a.prefix, "/"); n != "" && normalizePath(n) != n {
			return nil, fieldErr(fmt.Errorf("%q is never matched: paths are matched normalised (no ;, \\, repeated slashes or dot segments)", p.Prefix), "path", "prefix")
		}
		if a.prefix[0] != '/' {
			return nil, fieldErr(fmt.Errorf("%q is never matched: paths start with /", p.Prefix), "path", "prefix")
		}
	}
	if p.Regex != "" {
		src := p.Regex
		if a.fold {
			src = "(?i)" + src
		}
		re, err := compileRegex(src)
		if err != nil {
			return nil, fieldErr(err, "path", "regex")
		}
		a.re = re
	}
	return a, nil
}

// requestPath returns u's decoded path without a fragment: from a '#'
// that the request target held as itself (not as %23), which Go's server
// leaves in the path while browsers, nginx and the RFC cut it off
// (GET /login#x is routed to /login).
func requestPath(u *url.URL) string {
	// A raw '#' is escaped when the path is, so it makes a RawPath.
	raw, _, cut := strings.Cut(u.RawPath, "#")
	if !cut {
		return u.Path
	}
	if p, err := url.PathUnescape(raw); err == nil {
		return p
	}
	return lenientUnescape(raw)
}

func (a pathMatch) entry(rs *reqState) (rules.Entry, outcome) {
	p := normalizePath(requestPath(rs.r.URL))
	if a.fold {
		p = strings.ToLower(p)
	}
	switch {
	case a.exact != "" && p != a.exact:
		return rules.Entry{}, dropped
	case a.prefix != "" && !strings.HasPrefix(p, a.prefix):
		return rules.Entry{}, dropped
	case a.re != nil && !a.re.MatchString(p):
		return rules.Entry{}, dropped
	}
	return rules.Entry{Key: a.key, Value: or(a.value, p)}, produced
}
