// Package filedb lets the admin API change rules kept in files, so that
// one node needs no database: control.DB over a rules directory, each
// domain the admin API writes in DIR/DOMAIN.yaml (written to a temporary
// file renamed over it, which the rules Watcher then loads), versions and
// history in DIR/.sluice-admin/, a hidden directory the rules loader skips.
// The overrides are kept there too, in overrides.json (written to a
// temporary file renamed over it); a node applies them to the rules its
// Watcher loads with a control.Retriever whose Base is the Watcher's, and
// learns of a change made in its own process at once (Subscribe), of one
// made by another process at its next poll of the generation.
package filedb

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/rules"
)

// metaDir is the hidden directory of versions and history.
const metaDir = ".sluice-admin"

// historyKept is how many versions of each domain are kept: 100.
const historyKept = 100

// maxMetaBytes caps a metadata file read: 256 MiB (100 versions of a
// domain at the admin API's 4 MiB cap, with room).
const maxMetaBytes = 256 << 20

// overridesFile is the file of the overrides, in metaDir.
const overridesFile = "overrides.json"

// DB is a rules directory as a control.DB. It is safe for concurrent use
// within one process; two processes must not write one directory.
type DB struct {
	dir string
	ld  rules.Loader
	mu  sync.Mutex // serializes commits

	subMu sync.Mutex
	subs  map[*func(int64)]struct{} // Subscribe's, told of each commit
}

var (
	_ control.DB              = (*DB)(nil)
	_ control.OverridesReader = (*DB)(nil)
)

// meta is what the directory's metadata keeps of each domain written
// through the admin API.
type meta struct {
	Generation int64                  `json:"generation"`
	Domains    map[string]control.Doc `json:"domains"` // Text empty; Sum the text's digest
	Sums       map[string]string      `json:"sums"`
}

// Open returns the DB of the rules directory dir, read by ld (which must
// not read hidden entries: the Envoy layout needs IgnoreDotFiles). It
// writes nothing until a Commit, so that a node can read a directory it
// may not write (a ConfigMap).
func Open(dir string, ld rules.Loader) (*DB, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("rules directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("rules %s: the admin API writes rules files in a directory, not one file", dir)
	}
	if ld.EnvoyLayout && !ld.IgnoreDotFiles {
		return nil, fmt.Errorf("rules %s: the Envoy layout without --rules-ignore-dot-files would read the admin API's %s directory as rules", dir, metaDir)
	}
	return &DB{dir: dir, ld: ld, subs: map[*func(int64)]struct{}{}}, nil
}

func unavailable(err error) error { return fmt.Errorf("%w: %w", control.ErrUnavailable, err) }

func readCapped(path string, v any) error {
	b, err := readFileCapped(path)
	if err != nil || b == nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// readFileCapped reads path, nil for none, refusing more than
// maxMetaBytes.
func readFileCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxMetaBytes {
		return nil, fmt.Errorf("%s: above the cap of %d bytes", path, maxMetaBytes)
	}
	return b, nil
}

// errTooLarge is a rules file above the cap.
var errTooLarge = errors.New("too large")

// readRulesFile reads a rules file, refusing more than max bytes (zero
// means rules.DefaultMaxFileBytes) with errTooLarge before it is read
// whole.
func readRulesFile(path string, max int64) ([]byte, error) {
	if max <= 0 {
		max = rules.DefaultMaxFileBytes
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: above the cap of %d bytes on a rules file", errTooLarge, max)
	}
	return b, nil
}

// overrides is the contents of overridesFile.
type overrides struct {
	Overrides []control.OverrideRecord `json:"overrides"`
}

// maxOverrideEntries caps the entries of one override in the file, as the
// admin API caps them: 64.
const maxOverrideEntries = 64

// decodeOverrides reads the contents of overridesFile strictly: one JSON
// object with exactly the fields the DB writes, each override with a
// domain and 1 to 64 entries, no two for one descriptor. The file is
// the DB's, but a hand edit must not make a node misread it.
func decodeOverrides(b []byte) ([]control.OverrideRecord, error) {
	var ov overrides
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ov); err != nil {
		return nil, fmt.Errorf("%s: %w", overridesFile, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: more than one JSON value", overridesFile)
	}
	seen := make(map[string]bool, len(ov.Overrides))
	for i, o := range ov.Overrides {
		if len(o.Entries) == 0 || len(o.Entries) > maxOverrideEntries {
			return nil, fmt.Errorf("%s: overrides[%d]: %d entries; want 1 to %d", overridesFile, i, len(o.Entries), maxOverrideEntries)
		}
		k := o.Key()
		if seen[k] {
			return nil, fmt.Errorf("%s: overrides[%d]: a second override of %s", overridesFile, i, k)
		}
		seen[k] = true
	}
	return ov.Overrides, nil
}

// readOverrides reads the overrides, sorted by Key.
func (db *DB) readOverrides() ([]control.OverrideRecord, error) {
	b, err := readFileCapped(filepath.Join(db.dir, metaDir, overridesFile))
	if err != nil {
		return nil, unavailable(err)
	}
	if b == nil {
		return nil, nil
	}
	ovs, err := decodeOverrides(b)
	if err != nil {
		return nil, unavailable(err)
	}
	st := control.State{Overrides: ovs}
	control.SortState(&st)
	return st.Overrides, nil
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func (db *DB) readMeta() (*meta, error) {
	m := &meta{Domains: map[string]control.Doc{}, Sums: map[string]string{}}
	if err := readCapped(filepath.Join(db.dir, metaDir, "state.json"), m); err != nil {
		return nil, unavailable(err)
	}
	if m.Domains == nil {
		m.Domains = map[string]control.Doc{}
	}
	if m.Sums == nil {
		m.Sums = map[string]string{}
	}
	return m, nil
}

// file is the file the admin API keeps domain in: DIR/DOMAIN.yaml.
func (db *DB) file(domain string) (string, error) { return inside(db.dir, domain, ".yaml") }

// inside returns dir/name+ext for a domain's name, refusing one outside
// rules' grammar (rules.CheckDomain) and, whatever the grammar lets
// through, a path that is not a file of dir itself.
func inside(dir, name, ext string) (string, error) {
	if err := rules.CheckDomain(name); err != nil {
		return "", fmt.Errorf("%w: %w", control.ErrInvalid, err)
	}
	p := filepath.Join(dir, name+ext)
	if filepath.Dir(p) != filepath.Clean(dir) || filepath.Base(p) != name+ext {
		return "", fmt.Errorf("%w: domain %q: not a file name of its own", control.ErrInvalid, name)
	}
	return p, nil
}

// State reads every rules file of the directory: a file DOMAIN.yaml
// holding that one domain is the domain's current version (one more than
// the admin API's last when the file was edited by hand since); the
// domains of other files are listed at version 0, which the admin API
// does not write.
func (db *DB) State(context.Context) (*control.State, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.state()
}

func (db *DB) state() (*control.State, error) {
	m, err := db.readMeta()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(db.dir)
	if err != nil {
		return nil, unavailable(err)
	}
	st := &control.State{Generation: m.Generation}
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		ext := strings.ToLower(filepath.Ext(name))
		if e.IsDir() || strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		// Named as in the directory, so that no message (the admin API
		// answers with them) says where the directory is.
		text, err := readRulesFile(filepath.Join(db.dir, name), db.ld.MaxFileBytes)
		if errors.Is(err, errTooLarge) {
			return nil, fmt.Errorf("%w: rules file %s: %w", control.ErrInvalid, name, err)
		}
		if err != nil {
			return nil, unavailable(fmt.Errorf("rules file %s: %w", name, err))
		}
		src, err := db.ld.Parse(name, text)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", control.ErrInvalid, err)
		}
		ds := src.Domains()
		for i, d := range ds {
			doc := control.Doc{Domain: d, Text: string(text), Note: "in " + name}
			if i > 0 {
				doc.Text = "" // read with the file's first domain
			}
			if len(ds) == 1 && name == d+".yaml" {
				doc = m.Domains[d]
				doc.Domain, doc.Text = d, string(text)
				if m.Sums[d] != sum(text) {
					doc.Version++
					doc.Author, doc.Note = "", "edited outside the admin API"
				}
			}
			seen[d] = true
			st.Domains = append(st.Domains, doc)
		}
	}
	for d, doc := range m.Domains {
		if !seen[d] && doc.Deleted {
			st.Domains = append(st.Domains, doc)
		}
	}
	if st.Overrides, err = db.readOverrides(); err != nil {
		return nil, err
	}
	control.SortState(st)
	return st, nil
}

// ReadOverrides reads the generation and the overrides, without the rules
// files.
func (db *DB) ReadOverrides(context.Context) (*control.State, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	m, err := db.readMeta()
	if err != nil {
		return nil, err
	}
	ovs, err := db.readOverrides()
	if err != nil {
		return nil, err
	}
	return &control.State{Generation: m.Generation, Overrides: ovs}, nil
}

// Generation reads the generation of the admin API's last change.
func (db *DB) Generation(context.Context) (int64, error) {
	m, err := db.readMeta()
	if err != nil {
		return 0, err
	}
	return m.Generation, nil
}

// historyFile is the file of domain's versions:
// DIR/.sluice-admin/history/DOMAIN.json.
func (db *DB) historyFile(domain string) (string, error) {
	return inside(filepath.Join(db.dir, metaDir, "history"), domain, ".json")
}

// History returns the versions of domain, oldest first: those the admin
// API wrote, and the one in its file now when the admin API did not write
// it (the rules the server started with, or an edit made outside the admin
// API), so that it can be rolled back to.
func (db *DB) History(_ context.Context, domain string) ([]control.Doc, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	hf, err := db.historyFile(domain)
	if err != nil {
		return nil, err
	}
	var docs []control.Doc
	if err := readCapped(hf, &docs); err != nil {
		return nil, unavailable(err)
	}
	st, err := db.state()
	if err != nil {
		return nil, err
	}
	return withCurrent(docs, st, domain), nil
}

// withCurrent returns hist with domain's version in st appended when hist
// lacks it: a version in the domain's own file (DOMAIN.yaml) that the admin
// API did not write. A domain in a file it does not own (version 0) or
// deleted adds nothing.
func withCurrent(hist []control.Doc, st *control.State, domain string) []control.Doc {
	cur, ok := st.Domain(domain)
	if !ok || cur.Version == 0 || cur.Deleted || (len(hist) > 0 && hist[len(hist)-1].Version == cur.Version) {
		return hist
	}
	if cur.Note == "" {
		cur.Note = "in " + domain + ".yaml, not written through the admin API"
	}
	return append(hist, cur)
}

// Commit writes a change if the generation is still gen: a domain's new
// version (its file or its removal, its history), or the overrides file
// with an override set or deleted; then the metadata with the next
// generation, which is what a node polls. Each file is replaced whole
// (atomically); a crash between the two writes leaves the change made and
// the generation as it was, which the next change raises. Subscribers in
// this process are told at once.
func (db *DB) Commit(_ context.Context, gen int64, ch control.Change) (int64, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	m, err := db.readMeta()
	if err != nil {
		return 0, err
	}
	if m.Generation != gen {
		return m.Generation, control.ErrStale
	}
	if err := os.MkdirAll(filepath.Join(db.dir, metaDir, "history"), 0o700); err != nil {
		return 0, unavailable(err)
	}
	if ch.Doc != nil {
		if err := db.commitDoc(m, *ch.Doc); err != nil {
			return 0, err
		}
	} else if err := db.commitOverride(ch); err != nil {
		return 0, err
	}
	m.Generation++
	mb, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	if err := control.WriteFileAtomic(filepath.Join(db.dir, metaDir, "state.json"), mb, 0o600); err != nil {
		return 0, unavailable(err)
	}
	db.notify(m.Generation)
	return m.Generation, nil
}

// commitDoc writes domain document d and records it in m.
func (db *DB) commitDoc(m *meta, d control.Doc) error {
	st, err := db.state()
	if err != nil {
		return err
	}
	if cur, ok := st.Domain(d.Domain); ok && cur.Version == 0 && !cur.Deleted {
		return fmt.Errorf("%w: domain %q is in a rules file with another name or other domains: the admin API writes only %s.yaml", control.ErrInvalid, d.Domain, d.Domain)
	}
	hf, err := db.historyFile(d.Domain)
	if err != nil {
		return err
	}
	file, err := db.file(d.Domain)
	if err != nil {
		return err
	}
	var hist []control.Doc
	if err := readCapped(hf, &hist); err != nil {
		return unavailable(err)
	}
	// The version d replaces stays in the history even when the admin API
	// did not write it (the rules the server started with).
	hist = append(withCurrent(hist, st, d.Domain), d)
	if len(hist) > historyKept {
		hist = hist[len(hist)-historyKept:]
	}
	hb, err := json.Marshal(hist)
	if err != nil {
		return err
	}
	if err := control.WriteFileAtomic(hf, hb, 0o600); err != nil {
		return unavailable(err)
	}
	if d.Deleted {
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			return unavailable(err)
		}
	} else if err := control.WriteFileAtomic(file, []byte(d.Text), 0o644); err != nil {
		return unavailable(err)
	}
	rec := d
	rec.Text = ""
	m.Domains[d.Domain] = rec
	m.Sums[d.Domain] = sum([]byte(d.Text))
	return nil
}

// commitOverride writes the overrides file with ch's override set (in
// place of the one of the same descriptor) or deleted.
func (db *DB) commitOverride(ch control.Change) error {
	ovs, err := db.readOverrides()
	if err != nil {
		return err
	}
	out := overrides{Overrides: make([]control.OverrideRecord, 0, len(ovs)+1)}
	key := ch.DeleteOverride
	if ch.Override != nil {
		key = ch.Override.Key()
	}
	for _, o := range ovs {
		if o.Key() != key {
			out.Overrides = append(out.Overrides, o)
		}
	}
	if ch.Override != nil {
		out.Overrides = append(out.Overrides, *ch.Override)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	if err := control.WriteFileAtomic(filepath.Join(db.dir, metaDir, overridesFile), b, 0o600); err != nil {
		return unavailable(err)
	}
	return nil
}

// Subscribe calls notify with -1 once subscribed, then with the generation
// of each change this DB commits, until ctx ends: the rules Watcher sees
// the files change, and another process's changes are seen by polling.
func (db *DB) Subscribe(ctx context.Context, notify func(int64)) {
	key := &notify
	db.subMu.Lock()
	db.subs[key] = struct{}{}
	db.subMu.Unlock()
	notify(-1)
	<-ctx.Done()
	db.subMu.Lock()
	delete(db.subs, key)
	db.subMu.Unlock()
}

// notify tells the subscribers of generation gen.
func (db *DB) notify(gen int64) {
	db.subMu.Lock()
	defer db.subMu.Unlock()
	for f := range db.subs {
		(*f)(gen)
	}
}
