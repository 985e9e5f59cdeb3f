package identity

import (
	"strings"
	"testing"
)

func TestLint(t *testing.T) {
	t.Parallel()
	const head = "domain: api\nforward_auth_headers: X-Original\n"
	tests := []struct {
		name string
		doc  string
		want []string // warnings, each as a substring; in order
	}{
		{"per IP: nothing to say", head + "rate_limits:\n  - actions: [{remote_address: {}}]\n", nil},
		{"per IP beside per user", head + "jwt: {algorithm: HS256, key: k, require: [exp]}\nrate_limits:\n  - actions: [{jwt_claim: {descriptor_key: user}}]\n  - actions: [{remote_address: {}}]\n", nil},
		{"a constant with an optional entry is always sent", head + "rate_limits:\n  - actions: [{generic_key: {descriptor_value: all}}, {request_headers: {header_name: X-T, descriptor_key: t, skip_if_absent: true}}]\n", nil},
		{"default values are always sent", head + "jwt: {algorithm: HS256, key: k, require: [exp]}\nrate_limits:\n  - actions: [{jwt_claim: {descriptor_key: user, default_value: anon}}]\n", nil},
		{"only a JWT claim: garbage tokens are unlimited", head + "jwt: {algorithm: HS256, key: k, require: [exp]}\nrate_limits:\n  - actions:\n      - jwt_claim: {claim: sub, descriptor_key: user}\n",
			[]string{"test.yaml:4: rate_limits: a request can yield no descriptor and pass unlimited (rate_limits[0] needs a verified token with claim sub): keep a limit every request meets"}},
		{"a header, a path and skipped entries", head + `rate_limits:
  - actions: [{request_headers: {header_name: X-User, descriptor_key: user}}]
  - actions: [{remote_address: {}}, {path: {exact: /login}}]
  - actions: [{request_headers: {header_name: X-T, descriptor_key: t, skip_if_absent: true}}]
  - actions: [{header_value_match: {descriptor_value: bot, expect_match: false, headers: [{name: X-Human}]}}]
`, []string{"rate_limits[0] needs header X-User; rate_limits[1] needs path /login; rate_limits[2] needs one of its skip_if_absent values; rate_limits[3] needs headers that do not match header_value_match bot"}},
		{"no rate limits", head, []string{"rate_limits: no rate_limits: no request is limited"}},
		{"every peer trusted", head + "trusted_proxies: [10.0.0.0/8, 0.0.0.0/0, \"::/0\"]\nrate_limits: [{actions: [{remote_address: {}}]}]\n",
			[]string{"test.yaml:3: trusted_proxies[1]: 0.0.0.0/0 trusts every peer: any client can name its own address in X-Forwarded-For", "trusted_proxies[2]: ::/0 trusts every peer"}},
		{"tokens without exp", head + "jwt:\n  algorithm: HS256\n  key: k\nrate_limits: [{actions: [{remote_address: {}}]}]\n",
			[]string{"test.yaml:3: jwt.require: tokens without exp are believed for ever: add exp to require"}},
		{"a claim without a key", head + "rate_limits:\n  - actions:\n      - remote_address: {}\n      - jwt_claim: {descriptor_key: user, skip_if_absent: true}\n",
			[]string{"test.yaml:6: rate_limits[0].actions[1].jwt_claim: no jwt key is configured"}},
		{"no forward-auth headers", "domain: api\nrate_limits: [{actions: [{remote_address: {}}]}]\n",
			[]string{"forward_auth_headers: not set: forward-auth (sluice serve --identity) refuses the file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, ws, err := Lint("test.yaml", []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			if len(ws) != len(tt.want) {
				t.Fatalf("%d warnings %v, want %d", len(ws), ws, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(ws[i].Error(), w) {
					t.Errorf("warning %d: %q, want it to contain %q", i, ws[i], w)
				}
			}
		})
	}
	if _, _, err := Lint("test.yaml", []byte("domain: api\nrate_limits: [{actions: [{}]}]\n")); err == nil {
		t.Fatal("Lint of an invalid file gave no error")
	}
}

// TestShippedIdentitiesLint: the identity files the project ships give no
// warning.
func TestShippedIdentitiesLint(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"../examples/nginx/identity.yaml", "../examples/caddy/identity.yaml", "../examples/traefik/identity.yaml", "../examples/protect-identity.yaml", "testdata/hybrid.yaml"} {
		_, ws, err := LintFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			t.Errorf("%v", w)
		}
	}
}
