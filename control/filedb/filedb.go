// Package filedb lets the admin API change rules kept in files, so that
// one node needs no database: control.DB over a rules directory, each
// domain the admin API writes in DIR/DOMAIN.yaml (written to a temporary
// file renamed over it, which the rules Watcher then loads), versions and
// history in DIR/.sluice-admin/, a hidden directory the rules loader skips.
// Overrides need a rules database: they are refused here.
package filedb

import (
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

// DB is a rules directory as a control.DB. It is safe for concurrent use
// within one process; two processes must not write one directory.
type DB struct {
	dir string
	ld  rules.Loader
	mu  sync.Mutex
}

var _ control.DB = (*DB)(nil)

// meta is what the directory's metadata keeps of each domain written
// through the admin API.
type meta struct {
	Generation int64                  `json:"generation"`
	Domains    map[string]control.Doc `json:"domains"` // Text empty; Sum the text's digest
	Sums       map[string]string      `json:"sums"`
}

// Open returns the DB of the rules directory dir, read by ld (which must
// not read hidden entries: the Envoy layout needs IgnoreDotFiles).
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
	if err := os.MkdirAll(filepath.Join(dir, metaDir, "history"), 0o700); err != nil {
		return nil, fmt.Errorf("rules directory: %w", err)
	}
	return &DB{dir: dir, ld: ld}, nil
}

func unavailable(err error) error { return fmt.Errorf("%w: %w", control.ErrUnavailable, err) }

func readCapped(path string, v any) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxMetaBytes {
		return fmt.Errorf("%s: above the cap of %d bytes", path, maxMetaBytes)
	}
	return json.Unmarshal(b, v)
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

// file is the file the admin API keeps domain in.
func (db *DB) file(domain string) string { return filepath.Join(db.dir, domain+".yaml") }

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
		src, err := db.ld.Load(filepath.Join(db.dir, name))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", control.ErrInvalid, err)
		}
		text, err := os.ReadFile(filepath.Join(db.dir, name))
		if err != nil {
			return nil, unavailable(err)
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
	control.SortState(st)
	return st, nil
}

// Generation reads the generation of the admin API's last change.
func (db *DB) Generation(context.Context) (int64, error) {
	m, err := db.readMeta()
	if err != nil {
		return 0, err
	}
	return m.Generation, nil
}

func (db *DB) historyFile(domain string) string {
	return filepath.Join(db.dir, metaDir, "history", domain+".json")
}

// History returns the versions of domain the admin API wrote, oldest
// first.
func (db *DB) History(_ context.Context, domain string) ([]control.Doc, error) {
	var docs []control.Doc
	if err := readCapped(db.historyFile(domain), &docs); err != nil {
		return nil, unavailable(err)
	}
	return docs, nil
}

// Commit writes a domain's new version if the generation is still gen:
// its file (or its removal), its history, then the metadata. Overrides are
// refused.
func (db *DB) Commit(_ context.Context, gen int64, ch control.Change) (int64, error) {
	if ch.Doc == nil {
		return 0, fmt.Errorf("%w: overrides need a rules database (--rules redis://...)", control.ErrInvalid)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	m, err := db.readMeta()
	if err != nil {
		return 0, err
	}
	if m.Generation != gen {
		return m.Generation, control.ErrStale
	}
	d := *ch.Doc
	st, err := db.state()
	if err != nil {
		return 0, err
	}
	if cur, ok := st.Domain(d.Domain); ok && cur.Version == 0 && !cur.Deleted {
		return 0, fmt.Errorf("%w: domain %q is in a rules file with another name or other domains: the admin API writes only %s.yaml", control.ErrInvalid, d.Domain, d.Domain)
	}
	var hist []control.Doc
	if err := readCapped(db.historyFile(d.Domain), &hist); err != nil {
		return 0, unavailable(err)
	}
	hist = append(hist, d)
	if len(hist) > historyKept {
		hist = hist[len(hist)-historyKept:]
	}
	hb, err := json.Marshal(hist)
	if err != nil {
		return 0, err
	}
	if err := control.WriteFileAtomic(db.historyFile(d.Domain), hb, 0o600); err != nil {
		return 0, unavailable(err)
	}
	if d.Deleted {
		if err := os.Remove(db.file(d.Domain)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, unavailable(err)
		}
	} else if err := control.WriteFileAtomic(db.file(d.Domain), []byte(d.Text), 0o644); err != nil {
		return 0, unavailable(err)
	}
	m.Generation++
	rec := d
	rec.Text = ""
	m.Domains[d.Domain] = rec
	m.Sums[d.Domain] = sum([]byte(d.Text))
	mb, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	if err := control.WriteFileAtomic(filepath.Join(db.dir, metaDir, "state.json"), mb, 0o600); err != nil {
		return 0, unavailable(err)
	}
	return m.Generation, nil
}

// Subscribe does nothing until ctx ends: the rules Watcher sees the files
// change.
func (db *DB) Subscribe(ctx context.Context, _ func(int64)) { <-ctx.Done() }
