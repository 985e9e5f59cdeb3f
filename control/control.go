// Package control is sluice's control plane for rules that change at run
// time: a rules database (DB, implemented over Redis by control/redisdb)
// holding each domain's rules as a versioned document and the overrides,
// an Editor that validates every change exactly as rules files are
// validated before it writes it, atomically, and a Retriever that keeps
// each node's rules in step with the database (notifications and polling)
// and keeps the last good rules in memory and in a snapshot file.
package control

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Errors callers branch on (the admin API maps them to HTTP statuses).
var (
	// ErrConflict is a write whose If-Match names another version than the
	// one in force (HTTP 412): nothing was written.
	ErrConflict = errors.New("version conflict")
	// ErrUnavailable wraps a database that cannot be read or written
	// (HTTP 503): nothing was written.
	ErrUnavailable = errors.New("rules database unavailable")
	// ErrNotFound is a domain, version or override that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid wraps a change refused for what it is (HTTP 400), beside
	// rules.Errors for mistakes in rules.
	ErrInvalid = errors.New("invalid change")
	// ErrStale is a DB's answer to a Commit whose generation is no longer
	// the database's: nothing was written, and the Editor tries again.
	ErrStale = errors.New("stale generation")
)

// Doc is one version of a domain's rules document.
type Doc struct {
	Domain  string `json:"domain"`
	Version int64  `json:"version"` // 1 for the first, one more for each change
	// Text is the document as it was submitted, YAML or JSON; empty when
	// Deleted.
	Text    string    `json:"text,omitempty"`
	Deleted bool      `json:"deleted,omitempty"`
	Author  string    `json:"author"` // the admin token's name, or the CLI's
	Time    time.Time `json:"time"`
	// Note says why the version was made when it was not a plain write,
	// such as "rollback to version 3".
	Note string `json:"note,omitempty"`
}

// ETag returns the HTTP entity tag of d's version: "v7" in quotes.
func (d Doc) ETag() string { return `"v` + strconv.FormatInt(d.Version, 10) + `"` }

// Name is what stands for the document in error messages and as the
// rules' File: "domain@v7".
func (d Doc) Name() string { return d.Domain + "@v" + strconv.FormatInt(d.Version, 10) }

// OverrideRecord is an override as the database keeps it: the override
// and who set it when.
type OverrideRecord struct {
	rules.Override
	Author string    `json:"author"`
	Time   time.Time `json:"time"`
}

// Key returns the override's identity in the database: its domain and
// entries, unambiguously.
func (o OverrideRecord) Key() string { return OverrideKey(o.Domain, o.Entries) }

// OverrideKey returns the database identity of the override of entries in
// domain: their JSON, which no two descriptors share.
func OverrideKey(domain string, entries []rules.Entry) string {
	b, _ := json.Marshal(struct {
		D string        `json:"d"`
		E []rules.Entry `json:"e"`
	}{domain, entries}) // strings and a slice of them cannot fail
	return string(b)
}

// State is the whole of the database a node needs: the current version of
// every domain (deleted ones as tombstones, which keep their version
// count), the overrides, and the generation, which every change raises by
// one.
type State struct {
	Generation int64            `json:"generation"`
	Domains    []Doc            `json:"domains"`   // sorted by domain
	Overrides  []OverrideRecord `json:"overrides"` // sorted by Key
}

// SortState orders st's domains by name and overrides by Key, as State
// keeps them.
func SortState(st *State) { st.sort() }

// sort orders st's domains and overrides, each override's Key computed
// once.
func (st *State) sort() {
	slices.SortFunc(st.Domains, func(a, b Doc) int { return strings.Compare(a.Domain, b.Domain) })
	type keyed struct {
		key string
		o   OverrideRecord
	}
	ks := make([]keyed, len(st.Overrides))
	for i, o := range st.Overrides {
		ks[i] = keyed{o.Key(), o}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	for i := range ks {
		st.Overrides[i] = ks[i].o
	}
}

// Domain returns the current version of domain, and whether there is one
// (a tombstone counts).
func (st *State) Domain(domain string) (Doc, bool) {
	for _, d := range st.Domains {
		if d.Domain == domain {
			return d, true
		}
	}
	return Doc{}, false
}

// Build makes the Set of st, as every node does: the documents of the
// domains not deleted read by ld (a domain at version 0 without text is
// read with another's document, as a rules file of several domains is) (file:line errors name domain@vN), the
// store's veto check applied (nil accepts every limit), then the overrides
// in force at now.
func (st *State) Build(ld rules.Loader, check func(sluice.Limit) error, now time.Time) (*rules.Set, error) {
	docs := make([]rules.Document, 0, len(st.Domains))
	for _, d := range st.Domains {
		if !d.Deleted && (d.Text != "" || d.Version > 0) {
			docs = append(docs, rules.Document{Name: d.Name(), Data: []byte(d.Text)})
		}
	}
	s, err := ld.ParseDocuments(docs...)
	if err != nil {
		return nil, err
	}
	if err := s.Check(check); err != nil {
		return nil, err
	}
	return st.BuildOn(s, check, now)
}

// BuildOn makes the Set of the rules s (built and checked already, such
// as a rules.Watcher's of files) with st's overrides in force at now, the
// store's veto check applied to their limits; st's documents are not
// read.
func (st *State) BuildOn(s *rules.Set, check func(sluice.Limit) error, now time.Time) (*rules.Set, error) {
	ovs := make([]rules.Override, len(st.Overrides))
	for i, o := range st.Overrides {
		ovs[i] = o.Override
	}
	s, err := s.WithOverrides(now, ovs...)
	if err == nil {
		err = checkOverrides(s, check)
	}
	if err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	return s, nil
}

// checkOverrides applies the store's veto check to the limits of the
// overrides in force in s, as Set.Check does to the rules' limits.
func checkOverrides(s *rules.Set, check func(sluice.Limit) error) error {
	if check == nil {
		return nil
	}
	var errs []error
	for _, o := range s.Overrides() {
		for i, l := range o.Rule.Limits {
			if l.Unlimited || l.Block {
				continue // never taken from a store
			}
			for _, x := range []sluice.Limit{l.Enforced(), l.Limit} {
				if err := check(x); err != nil {
					errs = append(errs, fmt.Errorf("override of %s in domain %q: rate_limits[%d]: limit %s: %w", OverrideKey(o.Domain, o.Entries), o.Domain, i, x, err))
					break
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Change is one change to the database: a new version of a domain (a
// tombstone for a delete), an override set, or one deleted.
type Change struct {
	Doc            *Doc            // the domain's new version, with History's record
	Override       *OverrideRecord // set (added or replaced)
	DeleteOverride string          // the Key of an override to delete
}

// DB is a rules database. Its methods are safe for concurrent use; errors
// of the database itself wrap ErrUnavailable.
type DB interface {
	// State reads the whole state, consistently (one atomic read).
	State(ctx context.Context) (*State, error)
	// Generation reads the generation alone, for polling.
	Generation(ctx context.Context) (int64, error)
	// History returns the versions of domain kept, oldest first.
	History(ctx context.Context, domain string) ([]Doc, error)
	// Commit applies ch if the database's generation is still gen, as one
	// atomic step that also raises the generation and notifies the
	// nodes; otherwise it writes nothing and returns ErrStale.
	Commit(ctx context.Context, gen int64, ch Change) (int64, error)
	// Subscribe calls notify with the generation of each change
	// notification, and with -1 each time it has subscribed (a change may
	// have been missed before), until ctx ends, reconnecting as needed; it
	// returns when ctx ends.
	Subscribe(ctx context.Context, notify func(gen int64))
}

// OverrideReader is a DB that can read what setting or deleting one
// override needs without reading the others: the generation and the
// domains (State without Overrides), how many overrides it holds, and the
// one whose Key is key (nil for none). An Editor over one writes an
// override at a cost that does not grow with their number.
type OverrideReader interface {
	ReadOverride(ctx context.Context, key string) (st *State, overrides int, cur *OverrideRecord, err error)
}

// Caps on what is read of a database.
const (
	// MaxStateBytes caps a database's state as a node reads it, the JSON
	// of its domains and overrides: 128 MiB, the rules' cap on a
	// directory (64 MiB) with room for the overrides and JSON's escapes.
	// A state above it is refused before it is read whole.
	MaxStateBytes = 128 << 20
	// MaxDocBytes caps one stored version of a domain, its JSON: 32 MiB,
	// twice the rules' cap on a file.
	MaxDocBytes = 32 << 20
)

// OverridesReader is a DB that can read its state without the domains'
// documents: the generation and the overrides alone. A Retriever with a
// Base reads that instead of State.
type OverridesReader interface {
	ReadOverrides(ctx context.Context) (*State, error)
}

// maxOverrideEntries caps the entries of an override's descriptor: 64.
const maxOverrideEntries = 64

// OverrideID returns the identity of the override of entries in domain as
// it goes in a URL: its Key, base64url-encoded without padding.
func OverrideID(domain string, entries []rules.Entry) string {
	return base64.RawURLEncoding.EncodeToString([]byte(OverrideKey(domain, entries)))
}

// ParseOverrideID reads an OverrideID back into its domain and entries,
// strictly: exactly the JSON OverrideKey writes, at most 64 entries.
func ParseOverrideID(id string) (string, []rules.Entry, error) {
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil {
		return "", nil, fmt.Errorf("%w: override id: %w", ErrInvalid, err)
	}
	var k struct {
		D *string       `json:"d"`
		E []rules.Entry `json:"e"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil || dec.More() || k.D == nil {
		return "", nil, fmt.Errorf("%w: override id: not one an override has", ErrInvalid)
	}
	if len(k.E) == 0 || len(k.E) > maxOverrideEntries {
		return "", nil, fmt.Errorf("%w: override id: %d entries; want 1 to %d", ErrInvalid, len(k.E), maxOverrideEntries)
	}
	if OverrideKey(*k.D, k.E) != string(b) {
		return "", nil, fmt.Errorf("%w: override id: not one an override has", ErrInvalid)
	}
	return *k.D, k.E, nil
}
