package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// DefaultPoll is how often a Retriever reads the database's generation in
// case it missed a notification: every 5 seconds.
const DefaultPoll = 5 * time.Second

// maxSnapshotBytes caps the snapshot file a Retriever reads: a state's
// cap.
const maxSnapshotBytes = MaxStateBytes

// The sources of a reload, as RetrieverConfig.OnReload and the metrics
// name them.
const (
	SourceStart    = "start"    // the database, at start
	SourceSnapshot = "snapshot" // the snapshot file, at start with the database down
	SourceNotify   = "notify"   // a change notification
	SourcePoll     = "poll"     // the poll of the generation
	SourceExpiry   = "expiry"   // an override's end
	SourceFiles    = "files"    // new rules from Base (Rebase)
)

// RetrieverConfig configures a Retriever. A zero field means its default.
type RetrieverConfig struct {
	DB DB // required
	// Loader reads the documents; its caps apply.
	Loader rules.Loader
	// Check is the store's veto on limits: a set it refuses never comes
	// into force. Nil accepts every limit.
	Check func(sluice.Limit) error
	// Snapshot is the file that keeps the last good state, written (to a
	// temporary file renamed over it) after each reload and read at start
	// when the database cannot be; "" keeps none.
	Snapshot string
	// Poll is how often the generation is read; zero means DefaultPoll,
	// negative never (notifications only).
	Poll time.Duration
	// StartTimeout bounds the first read of the database before the
	// snapshot is used instead; zero means 5 seconds.
	StartTimeout time.Duration
	// Now is the clock of overrides' expiry; nil means time.Now.
	Now func() time.Time
	// Base, if not nil, gives the rules the database's overrides apply to,
	// instead of its documents: a rules.Watcher's Current for rules in
	// files (control/filedb keeps their overrides). Rebase must be called
	// each time it changes. With Base, a start whose overrides do not
	// build puts Base's rules in force alone (and OnReload says why), and
	// the database is read again at its next change; Snapshot is not used.
	Base func() *rules.Set
	// OnReload, if not nil, is told of each reload: the new Set, its
	// source (SourceStart, ...) and the database's generation it was built
	// from, or a nil Set and why the rules in force stay. It is called one
	// call at a time, from the Retriever's goroutines or NewRetriever's,
	// and must call no method of the Retriever.
	OnReload func(set *rules.Set, source string, generation int64, err error)
}

// Retriever keeps a node's rules in step with a rules database: it learns
// of a change at once from the database's notifications, reads the
// generation every Poll in case one was missed, and at each change builds
// the whole Set again and swaps it in; a state it cannot build (mistakes,
// the store's veto) leaves the Set in force. The last good state is kept
// in a snapshot file, from which a node starts while the database is
// down. Current never blocks. A Retriever is safe for concurrent use.
type Retriever struct {
	c   RetrieverConfig
	cur atomic.Pointer[rules.Set]

	mu       sync.Mutex // serializes reloads and guards the fields below
	state    *State     // the state in force
	tried    int64      // the last generation that failed to build, to try it once
	triedErr error      // why it failed
	base     *rules.Set // with Base: the rules the Set in force was built on

	kick   chan struct{} // an override's expiry changed
	notes  chan struct{} // a notification came: the generation may have changed
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// NewRetriever reads the database (or, when it cannot within
// StartTimeout, the snapshot), builds the Set and starts following the
// database until Close. It fails when neither gives a Set it can build.
func NewRetriever(ctx context.Context, c RetrieverConfig) (*Retriever, error) {
	if c.DB == nil {
		return nil, errors.New("control: RetrieverConfig.DB is required")
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 5 * time.Second // a Redis that does not answer in 5 s is down for a start
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	r := &Retriever{c: c, kick: make(chan struct{}, 1), notes: make(chan struct{}, 1), tried: -1}
	sctx, cancel := context.WithTimeout(ctx, c.StartTimeout)
	err := r.Refresh(sctx, SourceStart)
	cancel()
	if err != nil && c.Base != nil {
		// Rules in files need no database to start: their rules alone,
		// until the overrides build.
		r.mu.Lock()
		r.base = c.Base()
		r.cur.Store(r.base)
		r.mu.Unlock()
	} else if err != nil {
		st, serr := readSnapshot(c.Snapshot)
		if serr != nil {
			return nil, fmt.Errorf("rules database: %w; snapshot: %w", err, serr)
		}
		if serr := r.swap(st, SourceSnapshot, false); serr != nil {
			return nil, fmt.Errorf("rules database: %w; snapshot %s: %w", err, c.Snapshot, serr)
		}
	}
	lctx, lcancel := context.WithCancel(context.Background())
	r.cancel = lcancel
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		// notify runs in the database client's reader: it must not wait
		// for the database, so the loop reads what changed.
		c.DB.Subscribe(lctx, func(int64) {
			select {
			case r.notes <- struct{}{}:
			default: // a check is pending already
			}
		})
	}()
	go func() {
		defer r.wg.Done()
		r.loop(lctx)
	}()
	return r, nil
}

// Current returns the Set in force. It never blocks and never returns nil.
func (r *Retriever) Current() *rules.Set { return r.cur.Load() }

// State returns the database state in force (the Set's source).
func (r *Retriever) State() *State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// Close stops following the database and waits for the Retriever's
// goroutines; Current keeps answering. It is safe to call more than once.
func (r *Retriever) Close() error {
	r.once.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
		r.wg.Wait()
	})
	return nil
}

func (r *Retriever) generation() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == nil {
		return -1
	}
	return r.state.Generation
}

// loop polls the generation and rebuilds the Set when an override ends.
func (r *Retriever) loop(ctx context.Context) {
	var poll <-chan time.Time
	if r.c.Poll > 0 {
		t := time.NewTicker(r.c.Poll)
		defer t.Stop()
		poll = t.C
	}
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		expiry.Stop()
		if next := r.Current().NextExpiry(); !next.IsZero() {
			expiry.Reset(max(next.Sub(r.c.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-r.notes:
			r.check(ctx, SourceNotify)
		case <-poll:
			r.check(ctx, SourcePoll)
		case <-expiry.C:
			r.Expire()
		}
	}
}

// check reads the generation and refreshes when it is not the one in
// force.
func (r *Retriever) check(ctx context.Context, source string) {
	gen, err := r.c.DB.Generation(ctx)
	if err == nil && gen != r.generation() {
		r.refresh(ctx, source)
	}
}

// refresh is Refresh for the goroutines, whose errors OnReload reports.
func (r *Retriever) refresh(ctx context.Context, source string) { _ = r.Refresh(ctx, source) }

// Refresh reads the database and, if its generation is not the one in
// force, builds and swaps in its Set; source names the reason for
// OnReload. It returns why the Set in force stays, if it does for an error.
func (r *Retriever) Refresh(ctx context.Context, source string) error {
	read := r.c.DB.State
	if or, ok := r.c.DB.(OverridesReader); ok && r.c.Base != nil {
		read = or.ReadOverrides
	}
	st, err := read(ctx)
	if err != nil {
		r.report(nil, source, -1, err)
		return err
	}
	return r.swap(st, source, true)
}

// Expire builds the Set of the state in force again at the clock's now,
// so that overrides that ended leave it; the loop calls it when the first
// override to end does.
func (r *Retriever) Expire() {
	r.mu.Lock()
	st := r.state
	r.mu.Unlock()
	if st != nil {
		_ = r.swap(st, SourceExpiry, false)
	}
}

// Rebase builds the Set of the state in force again on Base's rules, when
// they are not those it was built on; a Set that does not build (an
// override for a rule the files no longer have) leaves the one in force,
// and OnReload says why. It does nothing without Base.
func (r *Retriever) Rebase() {
	if r.c.Base == nil {
		return
	}
	r.mu.Lock()
	st, base := r.state, r.c.Base()
	if st == nil && base != r.base {
		// Started without the database's state: the rules alone.
		r.base = base
		r.cur.Store(base)
		r.report(base, SourceFiles, -1, nil)
	}
	same := base == r.base
	r.mu.Unlock()
	if st != nil && !same {
		_ = r.swap(st, SourceFiles, false)
	}
}

// swap builds st's Set and puts it in force, writing the snapshot when
// save is set; a state that does not build leaves the Set in force.
func (r *Retriever) swap(st *State, source string, save bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	again := source == SourceExpiry || source == SourceFiles // the state in force, rebuilt
	if !again && r.state != nil && st.Generation == r.state.Generation {
		return nil // nothing new
	}
	if !again && st.Generation == r.tried {
		return r.triedErr // reported already
	}
	if r.c.Base == nil && len(st.Domains) == 0 && r.state != nil && len(r.state.Domains) > 0 {
		// Not even a deleted domain: a Redis that lost its data (restarted
		// without persistence, flushed), not a change anyone made.
		err := fmt.Errorf("rules database generation %d is empty, not even deleted domains: it lost its data; the rules in force (generation %d) stay until rules are written to it (sluice rules import)", st.Generation, r.state.Generation)
		r.tried, r.triedErr = st.Generation, err
		r.report(nil, source, st.Generation, err)
		return err
	}
	var s, base *rules.Set
	var err error
	if r.c.Base != nil {
		base = r.c.Base()
		s, err = st.BuildOn(base, r.c.Check, r.c.Now())
	} else {
		s, err = st.Build(r.c.Loader, r.c.Check, r.c.Now())
	}
	if err != nil {
		err = fmt.Errorf("rules database generation %d: %w", st.Generation, err)
		r.tried, r.triedErr = st.Generation, err
		if r.c.Base != nil && r.state == nil {
			// A start with Base: its rules alone are in force
			// (NewRetriever); the state is kept for Rebase and Expire to
			// try again.
			r.state = st
		}
		r.report(nil, source, st.Generation, err)
		return err
	}
	r.tried = -1
	r.state, r.base = st, base
	r.cur.Store(s)
	if save && r.c.Snapshot != "" && r.c.Base == nil {
		if err := writeSnapshot(r.c.Snapshot, st); err != nil {
			r.report(s, source, st.Generation, err)
			return nil
		}
	}
	select {
	case r.kick <- struct{}{}: // the next expiry may have changed
	default:
	}
	r.report(s, source, st.Generation, nil)
	return nil
}

func (r *Retriever) report(s *rules.Set, source string, gen int64, err error) {
	if r.c.OnReload != nil {
		r.c.OnReload(s, source, gen, err)
	}
}

// writeSnapshot writes st to path atomically: a temporary file beside it,
// synced, renamed over it.
func writeSnapshot(path string, st *State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	return WriteFileAtomic(path, b, 0o600)
}

// WriteFileAtomic writes data to path so that a reader sees the old
// contents or the new, never a part: to a temporary file in the same
// directory, synced, then renamed over path.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// readSnapshot reads the state a snapshot file keeps, refusing one above
// maxSnapshotBytes.
func readSnapshot(path string) (*State, error) {
	if path == "" {
		return nil, errors.New("none (--rules-snapshot is not set)")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSnapshotBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", path, err)
	}
	if len(b) > maxSnapshotBytes {
		return nil, fmt.Errorf("snapshot %s: above the cap of %d bytes", path, maxSnapshotBytes)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return &st, nil
}
