package identity

import (
	"crypto"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// maxTokenBytes is the longest bearer token parsed: 16 KiB, several times
// a token with many claims and an RS256 signature. A longer one is
// anonymous without being decoded.
const maxTokenBytes = 16 << 10

// verifier checks bearer tokens against one configured key.
type verifier struct {
	key     crypto.PublicKey // []byte for HS256
	parser  *jwt.Parser
	now     func() time.Time
	require []string // claims that must be present
}

func newVerifier(c *JWTConfig) (*verifier, error) {
	raw, err := readKey(c)
	if err != nil {
		return nil, err
	}
	v := &verifier{now: time.Now}
	switch c.Algorithm {
	case "HS256":
		v.key = raw
	case "RS256":
		if v.key, err = jwt.ParseRSAPublicKeyFromPEM(raw); err != nil {
			return nil, fieldErr(fmt.Errorf("RS256 public key: %w", err), "jwt", "key")
		}
	case "ES256":
		if v.key, err = jwt.ParseECPublicKeyFromPEM(raw); err != nil {
			return nil, fieldErr(fmt.Errorf("ES256 public key: %w", err), "jwt", "key")
		}
	default:
		return nil, fieldErr(fmt.Errorf("want HS256, RS256 or ES256, got %q", c.Algorithm), "jwt", "algorithm")
	}
	leeway := c.Leeway
	switch {
	case leeway == 0:
		leeway = defaultLeeway
	case leeway < 0 || leeway > maxLeeway:
		return nil, fieldErr(fmt.Errorf("want 0 (the default, %v) to %v, got %v", defaultLeeway, maxLeeway, c.Leeway), "jwt", "leeway")
	}
	if len(c.Require) > maxRequire {
		return nil, fieldErr(fmt.Errorf("at most %d claims, got %d", maxRequire, len(c.Require)), "jwt", "require")
	}
	seen := make(map[string]bool, len(c.Require))
	for i, name := range c.Require {
		switch {
		case name == "" || len(name) > maxClaimName:
			return nil, fieldErr(fmt.Errorf("want a claim name of 1 to %d bytes", maxClaimName), "jwt", "require", i)
		case seen[name]:
			return nil, fieldErr(fmt.Errorf("%q is listed twice", name), "jwt", "require", i)
		}
		seen[name] = true
	}
	v.require = c.Require
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{c.Algorithm}),
		jwt.WithJSONNumber(),
		jwt.WithTimeFunc(func() time.Time { return v.now() }),
		jwt.WithLeeway(leeway),
		jwt.WithIssuedAt(), // a token issued in the future is refused
	}
	if seen["exp"] {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// claims returns the claims of r's bearer token if it verifies, else nil:
// a missing, malformed, unverifiable, expired, not yet valid or future
// token, or one without a required claim, is anonymous.
func (v *verifier) claims(r *http.Request) map[string]any {
	tok, ok := bearer(r.Header.Get("Authorization"))
	if !ok || len(tok) > maxTokenBytes {
		return nil
	}
	claims := jwt.MapClaims{}
	t, err := v.parser.ParseWithClaims(tok, claims, func(*jwt.Token) (any, error) { return v.key, nil })
	if err != nil || !t.Valid {
		return nil
	}
	for _, name := range v.require {
		if claims[name] == nil { // absent, or null
			return nil
		}
	}
	return claims
}

// bearer returns the token of an "Authorization: Bearer <token>" value.
func bearer(h string) (string, bool) {
	const p = "bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	t := strings.TrimSpace(h[len(p):])
	return t, t != ""
}

// claimString formats a claim's value as a descriptor value: strings as
// they are, numbers and booleans in their JSON form; other kinds are absent.
func claimString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, v != ""
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}
