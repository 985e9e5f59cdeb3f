package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Caps on what an Editor lets into the database.
const (
	// DefaultMaxDomains is the cap on the domains of a database: 1,000.
	DefaultMaxDomains = 1000
	// DefaultMaxOverrides is the cap on its overrides: 100,000.
	DefaultMaxOverrides = 100_000
	// MaxOverrideTTL caps how far away an override's end may be: 366
	// days (one without an end is allowed).
	MaxOverrideTTL = 366 * 24 * time.Hour
	// maxOverrideLimits caps the limits of one override: 8, so that the
	// overrides a database may hold stay within what one Set builds.
	maxOverrideLimits = 8
	// commitAttempts is how many times an Editor checks a change again when
	// the database changed under it before it gives up.
	commitAttempts = 8
)

// EditorConfig configures an Editor. A zero field means its default.
type EditorConfig struct {
	DB DB // required
	// Loader reads documents as the nodes read them (its caps included).
	Loader rules.Loader
	// Check is the store's veto on limits (sluice.LimitChecker); nil
	// accepts every limit.
	Check func(sluice.Limit) error
	// Now is the clock of versions' times and overrides' expiry; nil means
	// time.Now.
	Now func() time.Time
	// Log receives one line for each change, with its author; nil means
	// slog.Default().
	Log *slog.Logger
	// MaxDomains caps the domains (tombstones included); zero means
	// DefaultMaxDomains.
	MaxDomains int
	// MaxOverrides caps the overrides; zero means DefaultMaxOverrides.
	MaxOverrides int
}

// Editor makes every change to a rules database: it checks the change
// against the database's state exactly as a node will build it (the
// store's veto included) and commits it only if the state did not change
// meanwhile, so that nothing invalid is ever stored. It is safe for
// concurrent use.
type Editor struct {
	c   EditorConfig
	ovr OverrideReader // c.DB's, or nil
}

// NewEditor returns an Editor for c.
func NewEditor(c EditorConfig) (*Editor, error) {
	if c.DB == nil {
		return nil, errors.New("control: EditorConfig.DB is required")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.MaxDomains <= 0 {
		c.MaxDomains = DefaultMaxDomains
	}
	if c.MaxOverrides <= 0 {
		c.MaxOverrides = DefaultMaxOverrides
	}
	ovr, _ := c.DB.(OverrideReader)
	return &Editor{c: c, ovr: ovr}, nil
}

// Result is what a change did, or, for a dry run, would do.
type Result struct {
	Doc     Doc    `json:"doc"`               // the domain's version after the change (of a domain change)
	Diff    string `json:"diff"`              // a unified diff of the document, from the version before
	Changed bool   `json:"changed"`           // false when the document was the same
	DryRun  bool   `json:"dry_run,omitempty"` // nothing was written
	// Generation is the database's generation after the change.
	Generation int64 `json:"generation"`
}

// Domain returns the current version of domain (ErrNotFound for none or
// a deleted one).
func (e *Editor) Domain(ctx context.Context, domain string) (Doc, error) {
	if err := checkDomain(domain); err != nil {
		return Doc{}, err
	}
	st, err := e.c.DB.State(ctx)
	if err != nil {
		return Doc{}, err
	}
	d, ok := st.Domain(domain)
	if !ok || d.Deleted {
		return Doc{}, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
	}
	return d, nil
}

// Domains returns the current version of every domain, tombstones left
// out, and the generation.
func (e *Editor) Domains(ctx context.Context) ([]Doc, int64, error) {
	st, err := e.c.DB.State(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []Doc
	for _, d := range st.Domains {
		if !d.Deleted {
			out = append(out, d)
		}
	}
	return out, st.Generation, nil
}

// HistoryEntry is one version of a domain with the diff from the version
// before it.
type HistoryEntry struct {
	Doc
	Diff string `json:"diff"`
}

// History returns the versions of domain kept by the database, newest
// first, each with its diff from the one before.
func (e *Editor) History(ctx context.Context, domain string) ([]HistoryEntry, error) {
	if err := checkDomain(domain); err != nil {
		return nil, err
	}
	docs, err := e.c.DB.History(ctx, domain)
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
	}
	out := make([]HistoryEntry, len(docs))
	for i, d := range docs {
		prev := Doc{Domain: d.Domain, Deleted: true}
		if i > 0 {
			prev = docs[i-1]
		}
		out[len(docs)-1-i] = HistoryEntry{Doc: d, Diff: diff(prev, d)}
	}
	return out, nil
}

// diff returns the unified diff of from's text to to's.
func diff(from, to Doc) string {
	name := func(d Doc) string {
		if d.Version == 0 {
			return "/dev/null"
		}
		return d.Name()
	}
	s, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{ // writes to a strings.Builder: no error
		A: difflib.SplitLines(from.Text), B: difflib.SplitLines(to.Text),
		FromFile: name(from), ToFile: name(to), Context: 3,
	})
	return s
}

// PutDomain makes text the new version of domain, by author. text is one
// rules document, YAML or JSON, whose domain must be domain; its mistakes
// come back all at once as rules.Errors placed at "request:LINE", the
// store's vetoes too. ifMatch, when not empty, is an entity tag the
// current version must have ("*" for any existing version), else
// ErrConflict. With dry set nothing is written and Result says what would
// change.
func (e *Editor) PutDomain(ctx context.Context, author, domain string, text []byte, ifMatch string, dry bool) (Result, error) {
	if err := checkDomain(domain); err != nil {
		return Result{}, err
	}
	if err := e.checkDocument(domain, text); err != nil {
		return Result{}, err
	}
	return e.commitDoc(ctx, author, domain, ifMatch, dry, "put", func(cur Doc) (Doc, error) {
		return Doc{Text: string(text)}, nil
	})
}

// Validate is a dry run of PutDomain for text's own domain: the mistakes,
// or what would change.
func (e *Editor) Validate(ctx context.Context, author string, text []byte) (Result, error) {
	s, err := e.parse(text)
	if err != nil {
		return Result{}, err
	}
	ds := s.Domains()
	if len(ds) != 1 {
		return Result{}, fmt.Errorf("%w: the document holds %d domains; want exactly one", ErrInvalid, len(ds))
	}
	return e.PutDomain(ctx, author, ds[0], text, "", true)
}

// DeleteDomain deletes domain, by author, if no override is for it; its
// history stays and a later PutDomain continues its versions.
func (e *Editor) DeleteDomain(ctx context.Context, author, domain, ifMatch string, dry bool) (Result, error) {
	return e.commitDoc(ctx, author, domain, ifMatch, dry, "delete", func(cur Doc) (Doc, error) {
		if cur.Version == 0 || cur.Deleted {
			return Doc{}, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
		}
		return Doc{Deleted: true}, nil
	})
}

// Rollback makes version of domain, as it was, the domain's new version,
// by author (a deleted version deletes the domain).
func (e *Editor) Rollback(ctx context.Context, author, domain string, version int64, ifMatch string, dry bool) (Result, error) {
	if err := checkDomain(domain); err != nil {
		return Result{}, err
	}
	hist, err := e.c.DB.History(ctx, domain)
	if err != nil {
		return Result{}, err
	}
	var old *Doc
	for i := range hist {
		if hist[i].Version == version {
			old = &hist[i]
		}
	}
	if old == nil {
		return Result{}, fmt.Errorf("domain %q version %d: %w", domain, version, ErrNotFound)
	}
	note := "rollback to version " + strconv.FormatInt(version, 10)
	return e.commitDoc(ctx, author, domain, ifMatch, dry, "rollback", func(cur Doc) (Doc, error) {
		return Doc{Text: old.Text, Deleted: old.Deleted, Note: note}, nil
	})
}

// checkDomain refuses a domain's name outside rules' grammar
// (rules.CheckDomain) as ErrInvalid, before it reaches the database.
func checkDomain(domain string) error {
	if err := rules.CheckDomain(domain); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// parse reads one submitted document alone, named "request" in errors,
// with the store's veto.
func (e *Editor) parse(text []byte) (*rules.Set, error) {
	s, err := e.c.Loader.ParseDocuments(rules.Document{Name: "request", Data: text})
	if err != nil {
		return nil, err
	}
	if err := s.Check(e.c.Check); err != nil {
		return nil, err
	}
	return s, nil
}

// checkDocument checks text alone as the rules of domain.
func (e *Editor) checkDocument(domain string, text []byte) error {
	s, err := e.parse(text)
	if err != nil {
		return err
	}
	if ds := s.Domains(); len(ds) != 1 || ds[0] != domain {
		return fmt.Errorf("%w: the document's domains are %q; want exactly %q, the domain of the URL", ErrInvalid, ds, domain)
	}
	return nil
}

// matches reports whether the entity tag list ifMatch (RFC 9110's
// If-Match) admits cur.
func matches(ifMatch string, cur Doc) bool {
	exists := cur.Version > 0 && !cur.Deleted
	for _, t := range strings.Split(ifMatch, ",") {
		t = strings.TrimSpace(t)
		if t == "*" && exists {
			return true
		}
		if exists && (t == cur.ETag() || t == "W/"+cur.ETag()) {
			return true
		}
	}
	return false
}

// commitDoc makes the domain's next version from next(current version) and
// commits it when the whole state still builds, retrying on a database that
// changed meanwhile.
func (e *Editor) commitDoc(ctx context.Context, author, domain, ifMatch string, dry bool, what string, next func(Doc) (Doc, error)) (Result, error) {
	for range commitAttempts {
		st, err := e.c.DB.State(ctx)
		if err != nil {
			return Result{}, err
		}
		cur, found := st.Domain(domain)
		// A domain stored before its name was refused may still be
		// deleted, so that the database builds again.
		if err := checkDomain(domain); err != nil && (what != "delete" || !found || cur.Version == 0) {
			return Result{}, err
		}
		if found && cur.Version == 0 && !cur.Deleted {
			// A rules file the database does not own (control/filedb).
			return Result{}, fmt.Errorf("%w: domain %q is %s, a rules file with another name or other domains: change it there, or move it to %s.yaml", ErrInvalid, domain, cur.Note, domain)
		}
		if ifMatch != "" && !matches(ifMatch, cur) {
			return Result{}, fmt.Errorf("domain %q is at version %d, not %s: %w", domain, cur.Version, ifMatch, ErrConflict)
		}
		d, err := next(cur)
		if err != nil {
			return Result{}, err
		}
		d.Domain, d.Version, d.Author, d.Time = domain, cur.Version+1, author, e.c.Now().UTC()
		if cur.Version == 0 && d.Deleted {
			return Result{}, fmt.Errorf("domain %q: %w", domain, ErrNotFound)
		}
		res := Result{Doc: d, Diff: diff(cur, d), Changed: cur.Text != d.Text || cur.Deleted != d.Deleted, DryRun: dry, Generation: st.Generation}
		if !res.Changed && cur.Version > 0 {
			res.Doc = cur // the same document again: no new version
			return res, nil
		}
		cand := *st
		cand.Domains = replaceDoc(st.Domains, d)
		if len(cand.Domains) > e.c.MaxDomains {
			return Result{}, fmt.Errorf("%w: %d domains, more than the cap of %d", ErrInvalid, len(cand.Domains), e.c.MaxDomains)
		}
		if _, err := cand.Build(e.c.Loader, e.c.Check, e.c.Now()); err != nil {
			return Result{}, fmt.Errorf("%w: the rules with this change do not build: %w", ErrInvalid, err)
		}
		if dry {
			return res, nil
		}
		gen, err := e.c.DB.Commit(ctx, st.Generation, Change{Doc: &d})
		if errors.Is(err, ErrStale) {
			continue
		}
		if err != nil {
			return Result{}, err
		}
		res.Generation = gen
		e.c.Log.Info("rules changed", "change", what, "domain", domain, "version", d.Version, "author", author, "note", d.Note, "generation", gen)
		return res, nil
	}
	return Result{}, fmt.Errorf("%w: the database changed %d times while the change was checked; try again", ErrUnavailable, commitAttempts)
}

// replaceDoc returns docs with d in place of its domain's, or added.
func replaceDoc(docs []Doc, d Doc) []Doc {
	out := make([]Doc, 0, len(docs)+1)
	found := false
	for _, x := range docs {
		if x.Domain == d.Domain {
			x, found = d, true
		}
		out = append(out, x)
	}
	if !found {
		out = append(out, d)
	}
	st := State{Domains: out}
	st.sort()
	return st.Domains
}

// Overrides returns the overrides in the database, expired ones included
// (they are out of force), sorted by Key.
func (e *Editor) Overrides(ctx context.Context) ([]OverrideRecord, error) {
	st, err := e.c.DB.State(ctx)
	if err != nil {
		return nil, err
	}
	return st.Overrides, nil
}

// Override returns the override of entries in domain.
func (e *Editor) Override(ctx context.Context, domain string, entries []rules.Entry) (OverrideRecord, error) {
	if err := checkDomain(domain); err != nil {
		return OverrideRecord{}, err
	}
	st, err := e.c.DB.State(ctx)
	if err != nil {
		return OverrideRecord{}, err
	}
	key := OverrideKey(domain, entries)
	for _, o := range st.Overrides {
		if o.Key() == key {
			return o, nil
		}
	}
	return OverrideRecord{}, fmt.Errorf("override of %s: %w", key, ErrNotFound)
}

// SetOverride adds o, by author, or replaces the override of the same
// descriptor. It must be for a descriptor a rule with limits matches, its
// limits valid (at most maxOverrideLimits), its expiry (if any) in the
// future and at most MaxOverrideTTL away. Its cost does not grow with the
// overrides in the database when the DB is an OverrideReader: the others
// are neither read nor checked again, as each override is checked alone
// against the same rules (they were when they were set, and a change of
// the rules is checked with all of them), and the caps on their number
// and limits keep the whole within what a node builds.
func (e *Editor) SetOverride(ctx context.Context, author string, o rules.Override, dry bool) (OverrideRecord, error) {
	if err := checkDomain(o.Domain); err != nil {
		return OverrideRecord{}, err
	}
	now := e.c.Now()
	if !o.Expires.IsZero() && !o.Expires.After(now) {
		return OverrideRecord{}, fmt.Errorf("%w: expires %s is not in the future", ErrInvalid, o.Expires.Format(time.RFC3339))
	}
	if o.Expires.After(now.Add(MaxOverrideTTL)) {
		return OverrideRecord{}, fmt.Errorf("%w: expires %s is more than %v away; an override ends within %v or never", ErrInvalid, o.Expires.Format(time.RFC3339), MaxOverrideTTL, MaxOverrideTTL)
	}
	for _, e := range o.Entries {
		if !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value) {
			return OverrideRecord{}, fmt.Errorf("%w: the keys and values must be UTF-8", ErrInvalid)
		}
	}
	if len(o.Entries) > maxOverrideEntries {
		return OverrideRecord{}, fmt.Errorf("%w: %d entries; want at most %d", ErrInvalid, len(o.Entries), maxOverrideEntries)
	}
	if len(o.Limits) > maxOverrideLimits {
		return OverrideRecord{}, fmt.Errorf("%w: %d rate_limits; want at most %d", ErrInvalid, len(o.Limits), maxOverrideLimits)
	}
	rec := OverrideRecord{Override: o, Author: author, Time: now.UTC()}
	key := rec.Key()
	for range commitAttempts {
		st, n, cur, err := e.readOverride(ctx, key)
		if err != nil {
			return OverrideRecord{}, err
		}
		if cur == nil {
			n++
		}
		if n > e.c.MaxOverrides {
			return OverrideRecord{}, fmt.Errorf("%w: %d overrides, more than the cap of %d", ErrInvalid, n, e.c.MaxOverrides)
		}
		// The rules in the database, then the override alone on them.
		base := State{Domains: st.Domains}
		bs, err := base.Build(e.c.Loader, e.c.Check, now)
		if err != nil {
			return OverrideRecord{}, fmt.Errorf("%w: the rules in the database do not build: %w", ErrInvalid, err)
		}
		os, err := bs.WithOverrides(now, o)
		if err == nil {
			err = checkOverrides(os, e.c.Check)
		}
		if err != nil {
			return OverrideRecord{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if dry {
			return rec, nil
		}
		gen, err := e.c.DB.Commit(ctx, st.Generation, Change{Override: &rec})
		if errors.Is(err, ErrStale) {
			continue
		}
		if err != nil {
			return OverrideRecord{}, err
		}
		e.c.Log.Info("override set", "domain", o.Domain, "entries", key, "expires", o.Expires, "author", author, "generation", gen)
		return rec, nil
	}
	return OverrideRecord{}, fmt.Errorf("%w: the database changed %d times while the change was checked; try again", ErrUnavailable, commitAttempts)
}

// readOverride reads what a change of the override of key needs: the
// state without the overrides, how many there are and the one of key; by
// the DB's ReadOverride if it has one, else from its whole state.
func (e *Editor) readOverride(ctx context.Context, key string) (*State, int, *OverrideRecord, error) {
	if e.ovr != nil {
		return e.ovr.ReadOverride(ctx, key)
	}
	st, err := e.c.DB.State(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	var cur *OverrideRecord
	for i := range st.Overrides {
		if st.Overrides[i].Key() == key {
			cur = &st.Overrides[i]
		}
	}
	return st, len(st.Overrides), cur, nil
}

// DeleteOverride deletes the override of entries in domain, by author,
// and returns it. With dry set nothing is written: it returns the override
// that would be deleted.
func (e *Editor) DeleteOverride(ctx context.Context, author, domain string, entries []rules.Entry, dry bool) (OverrideRecord, error) {
	if err := checkDomain(domain); err != nil {
		return OverrideRecord{}, err
	}
	key := OverrideKey(domain, entries)
	for range commitAttempts {
		st, _, cur, err := e.readOverride(ctx, key)
		if err != nil {
			return OverrideRecord{}, err
		}
		if cur == nil {
			return OverrideRecord{}, fmt.Errorf("override of %s: %w", key, ErrNotFound)
		}
		if dry {
			return *cur, nil
		}
		gen, err := e.c.DB.Commit(ctx, st.Generation, Change{DeleteOverride: key})
		if errors.Is(err, ErrStale) {
			continue
		}
		if err != nil {
			return OverrideRecord{}, err
		}
		e.c.Log.Info("override deleted", "domain", domain, "entries", key, "author", author, "generation", gen)
		return *cur, nil
	}
	return OverrideRecord{}, fmt.Errorf("%w: the database changed %d times while the change was checked; try again", ErrUnavailable, commitAttempts)
}
