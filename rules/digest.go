package rules

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// DefaultDigestAbove is the length in bytes above which a descriptor's
// value is kept in keys as its digest unless a caller says otherwise
// (decide.Config.DigestAbove, admit.Config.DigestAbove): longer values
// cost a digest, shorter ones are kept as they are.
const DefaultDigestAbove = 256

// DigestPrefix begins the digest that stands for a value in keys. No value
// kept as itself begins with it (such a value is digested too), so a
// digest never names the same counter as a value.
const DigestPrefix = "sha256:"

// Digests reports whether value v is kept in keys as its digest: longer
// than above bytes, or beginning with DigestPrefix.
func Digests(v string, above int) bool {
	return len(v) > above || strings.HasPrefix(v, DigestPrefix)
}

// AppendDigested appends entries to dst with each value that Digests
// (above) replaced by its digest: DigestPrefix and the first 128 bits of
// its SHA-256 in unpadded base64url, 29 bytes in all.
func AppendDigested(dst, entries []Entry, above int) []Entry {
	for _, e := range entries {
		if Digests(e.Value, above) {
			sum := sha256.Sum256([]byte(e.Value))
			e.Value = DigestPrefix + base64.RawURLEncoding.EncodeToString(sum[:16])
		}
		dst = append(dst, e)
	}
	return dst
}
