package decide

import "github.com/sluicehq/sluice/rules"

// appendClient appends the client part of the store keys of a descriptor
// that matched rule r: the request's values as rules.Rule.AppendKey writes
// them (length-prefixed, the pattern for share_threshold levels), without
// the limit's ID. The part is the same for every limit of the descriptor.
func appendClient(b []byte, r *rules.Rule, l *rules.Limit, entries []Entry) []byte {
	n := len(b)
	b = r.AppendKey(b, l, entries)
	return append(b[:n], b[n+len(l.ID):]...)
}

// appendKey appends the store key of limit l to b, given the client part of
// its descriptor: the limit's ID, then the client part in a Redis Cluster
// hash tag, so that all limits of one descriptor live on one shard:
//
//	3f2a9c01d4e5b6a7{|5:alice|13:messages.send}
//
// The ID already names the domain and the descriptor's keys. A value that
// holds a } ends the hash tag early, but at the same place for every limit
// of the descriptor.
func appendKey(b []byte, l *rules.Limit, client []byte) []byte {
	b = append(b, l.ID...)
	b = append(b, '{')
	b = append(b, client...)
	return append(b, '}')
}
