package rules

import (
	"hash/maphash"
	"math/bits"
	"time"
)

// overrideIndex holds the overrides in force in one domain of a Set, so
// that Match finds one with one hash of the request's descriptor and
// mostly one cache line: a Bloom filter of the descriptors' hashes, which
// a descriptor without an override rarely gets past; an open-addressed
// table of 32-byte slots, each with a hash, the override's rule and its
// descriptor, encoded (appendEntries), when that takes at most
// inlineKey bytes, or else where in keys it is; and the distinct rules
// (overrides with the same limits for the same rule share one). It holds
// few pointers, so that a large one costs the garbage collector little,
// and Match allocates nothing. An overrideIndex is immutable once built.
type overrideIndex struct {
	seed   maphash.Seed
	filter []uint64       // len a power of two; see filterBits
	slots  []overrideSlot // len a power of two, at most half of them used
	recs   []overrideRec  // in the order the overrides were given
	keys   string         // the descriptors of recs, encoded
	rules  []*Rule        // the distinct rules of recs
	// lens has bit n set when an override's descriptor has n entries
	// (bit 63 for 63 or more; never bit 0), and keyLens bit n%64 when the
	// key of its last entry is n bytes long, so that most descriptors of
	// a rule without overrides are not even hashed.
	lens, keyLens uint64
}

// inlineKey is how long an encoded descriptor a slot holds itself: 15
// bytes, so that a slot is 32 and a line of the CPU's cache holds two.
const inlineKey = 15

// notInline is overrideSlot.n for a descriptor kept in keys.
const notInline = 0xff

// overrideSlot is one place of the table. rec is where its override is
// in recs, plus one; 0 is an empty place.
type overrideSlot struct {
	hash uint64
	rec  int32
	rule int32 // the override's rule, in rules
	n    uint8 // the length of the descriptor in key, or notInline
	key  [inlineKey]byte
}

// overrideRec is one override in force.
type overrideRec struct {
	off, end int       // its descriptor, encoded: keys[off:end]
	rule     int32     // its rule, in rules
	pos      int32     // its index in the overrides given to WithOverrides
	expires  time.Time // the zero time: never
}

// filterBits returns the word of the filter for hash h (given the
// filter's mask) and the four bits of that word it sets.
func filterBits(h, mask uint64) (uint64, uint64) {
	return (h >> 32) & mask, 1<<(h&63) | 1<<((h>>6)&63) | 1<<((h>>12)&63) | 1<<((h>>18)&63)
}

// lenBit returns the bit of lens for a descriptor of n entries.
func lenBit(n int) uint64 { return 1 << min(n, 63) }

// keyBit returns the bit of keyLens for a descriptor of one or more
// entries.
func keyBit(entries []Entry) uint64 { return 1 << (len(entries[len(entries)-1].Key) % 64) }

// hashEntries hashes a descriptor with seed: the hash of each key and
// value, mixed in order.
func hashEntries(seed maphash.Seed, entries []Entry) uint64 {
	h := uint64(len(entries))
	for i := range entries {
		h = bits.RotateLeft64(h^maphash.String(seed, entries[i].Key), 31) * 0x9e3779b97f4a7c15
		h = bits.RotateLeft64(h^maphash.String(seed, entries[i].Value), 29) * 0xc2b2ae3d27d4eb4f
	}
	return h
}

// appendEntries appends the encoding of a descriptor to b: each key and
// value as its length (uvarint) and its bytes.
func appendEntries(b []byte, entries []Entry) []byte {
	for _, e := range entries {
		b = appendString(b, e.Key)
		b = appendString(b, e.Value)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	n := uint64(len(s))
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(append(b, byte(n)), s...)
}

// cutString reads a string that appendString wrote at the start of enc:
// it returns the rest of enc and whether that string is s.
func cutString[T string | []byte](enc T, s string) (T, bool) {
	var n uint64
	for shift := uint(0); ; shift += 7 {
		if len(enc) == 0 || shift > 63 {
			return enc, false
		}
		c := enc[0]
		enc = enc[1:]
		n |= uint64(c&0x7f) << shift
		if c < 0x80 {
			break
		}
	}
	if n != uint64(len(s)) || uint64(len(enc)) < n || string(enc[:n]) != s {
		return enc, false
	}
	return enc[n:], true
}

// decodeEntries reads back a descriptor that appendEntries encoded.
func decodeEntries(enc string) []Entry {
	var out []Entry
	for enc != "" {
		var e Entry
		e.Key, enc = readString(enc)
		e.Value, enc = readString(enc)
		out = append(out, e)
	}
	return out
}

func readString(enc string) (string, string) {
	var n uint64
	for shift := uint(0); enc != ""; shift += 7 {
		c := enc[0]
		enc = enc[1:]
		n |= uint64(c&0x7f) << shift
		if c < 0x80 {
			break
		}
	}
	n = min(n, uint64(len(enc)))
	return enc[:n], enc[n:]
}

// equalEntries reports whether enc is the encoding of entries.
func equalEntries[T string | []byte](enc T, entries []Entry) bool {
	for i := range entries {
		var ok bool
		if enc, ok = cutString(enc, entries[i].Key); !ok {
			return false
		}
		if enc, ok = cutString(enc, entries[i].Value); !ok {
			return false
		}
	}
	return len(enc) == 0
}

// lookup returns the rule of the override of entries, or nil. It
// allocates nothing.
func (x *overrideIndex) lookup(entries []Entry) *Rule {
	// lens first: it has no bit for an empty descriptor, which has no key.
	if x.lens&lenBit(len(entries)) == 0 || x.keyLens&keyBit(entries) == 0 {
		return nil
	}
	h := hashEntries(x.seed, entries)
	if w, bits := filterBits(h, uint64(len(x.filter)-1)); x.filter[w]&bits != bits {
		return nil
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		sl := &x.slots[i]
		if sl.rec == 0 {
			return nil
		}
		if sl.hash != h {
			continue
		}
		if sl.n != notInline {
			if equalEntries(sl.key[:sl.n], entries) {
				return x.rules[sl.rule]
			}
		} else if rec := &x.recs[sl.rec-1]; equalEntries(x.keys[rec.off:rec.end], entries) {
			return x.rules[sl.rule]
		}
	}
}

// overrideBuilder builds the overrideIndex of one domain.
type overrideBuilder struct {
	x     overrideIndex
	keys  []byte
	seen  map[string]bool           // the encoded descriptors added
	rules map[overrideRuleKey]int32 // where each rule is in x.rules
	hash  []uint64                  // of each of x.recs
}

// overrideRuleKey identifies an override's rule by what it is built
// from: the rule it overrides and its limits as JSON.
type overrideRuleKey struct {
	base   *Rule
	limits string
}

func newOverrideBuilder() *overrideBuilder {
	return &overrideBuilder{x: overrideIndex{seed: maphash.MakeSeed()}, seen: map[string]bool{}, rules: map[overrideRuleKey]int32{}}
}

// has reports whether an override of entries was added.
func (b *overrideBuilder) has(entries []Entry) bool {
	n := len(b.keys)
	b.keys = appendEntries(b.keys, entries)
	dup := b.seen[string(b.keys[n:])]
	b.keys = b.keys[:n]
	return dup
}

// rule returns the rule added for key, if any.
func (b *overrideBuilder) rule(key overrideRuleKey) (*Rule, bool) {
	i, ok := b.rules[key]
	if !ok {
		return nil, false
	}
	return b.x.rules[i], true
}

// add adds the override of entries, the override at pos, whose rule r
// is built from key.
func (b *overrideBuilder) add(entries []Entry, key overrideRuleKey, r *Rule, pos int, expires time.Time) {
	ri, ok := b.rules[key]
	if !ok {
		ri = int32(len(b.x.rules))
		b.x.rules = append(b.x.rules, r)
		b.rules[key] = ri
	}
	off := len(b.keys)
	b.keys = appendEntries(b.keys, entries)
	b.seen[string(b.keys[off:])] = true
	b.x.recs = append(b.x.recs, overrideRec{off: off, end: len(b.keys), rule: ri, pos: int32(pos), expires: expires})
	b.hash = append(b.hash, hashEntries(b.x.seed, entries))
	b.x.lens |= lenBit(len(entries))
	b.x.keyLens |= keyBit(entries)
}

// index returns the built index.
func (b *overrideBuilder) index() *overrideIndex {
	x := b.x
	x.keys = string(b.keys)
	x.filter = make([]uint64, 1<<bits.Len(uint(len(x.recs)/4)))
	fmask := uint64(len(x.filter) - 1)
	x.slots = make([]overrideSlot, 1<<bits.Len(uint(len(x.recs)+len(x.recs)/2)))
	mask := uint64(len(x.slots) - 1)
	for r, h := range b.hash {
		w, bits := filterBits(h, fmask)
		x.filter[w] |= bits
		i := h & mask
		for x.slots[i].rec != 0 {
			i = (i + 1) & mask
		}
		rec := &x.recs[r]
		sl := overrideSlot{hash: h, rec: int32(r + 1), rule: rec.rule, n: notInline}
		if n := rec.end - rec.off; n <= inlineKey {
			sl.n = uint8(copy(sl.key[:], x.keys[rec.off:rec.end]))
		}
		x.slots[i] = sl
	}
	return &x
}
