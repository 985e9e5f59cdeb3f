package decide

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// appendClient appends the client part of the store keys of a descriptor
// that matched rule r: the request's values as rules.Rule.AppendKey writes
// them (length-prefixed, the pattern for share_threshold levels), without
// the limit's ID. The part is the same for every limit of the descriptor.
//
// A limit's store key is its ID followed by the client part, such as
//
//	3f2a9c01d4e5b6a7|5:alice|13:messages.send
//
// (the ID names the domain and the descriptor's keys), and its
// sluice.Request.Group is the client part, so that a store that places
// keys (store/redis in a cluster) keeps all limits of one descriptor
// together.
func appendClient(b []byte, r *rules.Rule, l *rules.Limit, entries []Entry) []byte {
	n := len(b)
	b = r.AppendKey(b, l, entries)
	return append(b[:n], b[n+len(l.ID):]...)
}

// digestPrefix begins the digest that stands for a value in store keys. No
// value kept as itself begins with it (such a value is digested too), so a
// digest never names the same counter as a value.
const digestPrefix = "sha256:"

// digests reports whether value v is kept in store keys as its digest:
// longer than c.digest bytes, or beginning with digestPrefix.
func (c *caps) digests(v string) bool {
	return len(v) > c.digest || strings.HasPrefix(v, digestPrefix)
}

// appendDigested appends entries to dst with each value that c.digests
// replaced by its digest: digestPrefix and the first 128 bits of its
// SHA-256 in unpadded base64url, 29 bytes in all.
func (c *caps) appendDigested(dst, entries []Entry) []Entry {
	for _, e := range entries {
		if c.digests(e.Value) {
			sum := sha256.Sum256([]byte(e.Value))
			e.Value = digestPrefix + base64.RawURLEncoding.EncodeToString(sum[:16])
		}
		dst = append(dst, e)
	}
	return dst
}
