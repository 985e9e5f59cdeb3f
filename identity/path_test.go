package identity

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzNormalizePath checks the normaliser on arbitrary decoded paths: the
// result starts with a slash, is valid UTF-8, has no ;parameters,
// backslashes, empty or dot segments, trailing slash or trailing spaces in
// a segment, and normalising it again changes nothing. The shortcut for
// paths already normal agrees with the full work.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/login", "/Login", "/login;jsessionid=1", "/login ", "/a/../login", "//login/",
		`\static\..\login`, "/..;/login", "/\xff\xfe", "", ".", "..", "a;b/c", "/a/./b/", "/%20/", "/\x00", "/ü/ß"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := normalizePath(p)
		if !strings.HasPrefix(got, "/") || !utf8.ValidString(got) {
			t.Fatalf("%q: %q does not start with / or is not UTF-8", p, got)
		}
		if strings.ContainsAny(got, `;\`) || (len(got) > 1 && strings.HasSuffix(got, "/")) {
			t.Fatalf("%q: %q has ; or \\ or a trailing slash", p, got)
		}
		if got != "/" {
			for _, seg := range strings.Split(got[1:], "/") {
				if seg == "" || seg == "." || seg == ".." {
					t.Fatalf("%q: %q has segment %q", p, got, seg)
				}
				if last := seg[len(seg)-1]; last <= ' ' || last == 0x7f {
					t.Fatalf("%q: %q has segment %q ending in %q", p, got, seg, last)
				}
			}
		}
		if again := normalizePath(got); again != got {
			t.Fatalf("%q: %q, then %q", p, got, again)
		}
		if isNormal(p) && normalizeSlow(p) != p {
			t.Fatalf("%q is taken as normal but normalises to %q", p, normalizeSlow(p))
		}
	})
}

func TestPathConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, action, want string }{
		{"exact with a trailing slash", "{exact: /login/}", `path.exact: "/login/" is never matched: paths are matched normalised, write "/login"`},
		{"exact with a parameter", "{exact: /login;x}", `write "/login"`},
		{"exact without a leading slash", "{exact: login}", `write "/login"`},
		{"prefix with a dot segment", "{prefix: /a/../b/}", `path.prefix: "/a/../b/" is never matched`},
		{"prefix without a leading slash", "{prefix: api/}", `path.prefix: "api/" is never matched`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("test.yaml", []byte("domain: api\nrate_limits:\n  - actions:\n      - path: "+tt.action+"\n"))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "test.yaml:4: rate_limits[0].actions[0].path") {
				t.Fatalf("error %v, want test.yaml:4: ... %s", err, tt.want)
			}
		})
	}
	for _, ok := range []string{"{exact: /}", "{prefix: /}", "{prefix: /api/}", "{exact: /Login, ignore_case: true}", "{prefix: /v1}"} {
		if _, err := Parse("test.yaml", []byte("domain: api\nrate_limits:\n  - actions:\n      - path: "+ok+"\n")); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
