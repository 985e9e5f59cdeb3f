package decide

import "github.com/sluicehq/sluice/rules"

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

// digests reports whether value v is kept in store keys as its digest
// (rules.Digests above Config.DigestAbove).
func (c *caps) digests(v string) bool { return rules.Digests(v, c.digest) }

// appendDigested appends entries to dst with each value that c.digests
// replaced by its digest (rules.AppendDigested).
func (c *caps) appendDigested(dst, entries []Entry) []Entry {
	return rules.AppendDigested(dst, entries, c.digest)
}
