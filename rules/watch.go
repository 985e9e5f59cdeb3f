package rules

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluicehq/sluice"
)

// debounce is how long a Watcher waits after the last change it sees before
// it reloads, so that a burst of events (an editor's write and rename, a
// ConfigMap's new directory, symlink swap and removal) makes one reload.
const debounce = 100 * time.Millisecond

// Watcher keeps the rules at a path loaded: it watches the directory that
// holds them with fsnotify and, after each burst of changes, loads them
// again and swaps the new Set in. A reload that fails keeps the Set in
// force. Current never blocks, even during a reload. A Watcher is safe for
// concurrent use.
//
// The directory is watched rather than the files, so that editors that
// write a new file and rename it over the old one, and Kubernetes, which
// updates a mounted ConfigMap by pointing the ..data symlink at a new
// directory, are seen. If path is itself a symlink to a directory, swapping
// that symlink is not seen, except in the Loader's EnvoyLayout: there the
// directories that hold the symbolic links on the way to path are watched
// too, and every directory below it, so that publishing new rules as
// Envoy's runtime is published (swapping /srv/runtime_data/current) and
// edits in subdirectories are seen.
type Watcher struct {
	ld       Loader
	path     string
	dir      string // the watched directory
	file     string // the rules file's name when path is a file, else ""
	onReload func(*Set, error)
	check    func(sluice.Limit) error // nil: every limit is accepted
	fw       *fsnotify.Watcher
	cur      atomic.Pointer[Set]
	// absentOK is WithAbsent's; absent is set while path does not exist
	// and the directories above it are watched instead (in above).
	absentOK bool
	absent   atomic.Bool
	above    []string

	closeOnce sync.Once
	done      chan struct{}   // closed by Close
	stopped   chan struct{}   // closed when the loop returns
	reloads   chan chan error // Reload's requests, answered by the loop
}

// WatchOption changes how a Watcher loads rules.
type WatchOption func(*Watcher)

// WithCheck makes a Watcher refuse rules that check vetoes (see
// Set.Check), at the first load and at every reload, as it refuses rules
// with mistakes: a vetoed set never replaces the one in force. check is
// typically the store's sluice.LimitChecker.CheckLimit.
func WithCheck(check func(sluice.Limit) error) WatchOption {
	return func(w *Watcher) { w.check = check }
}

// WithAbsent lets the rules be missing at the start, as Envoy's ratelimit
// starts without its runtime directory: when path does not exist, or is a
// directory without rules files, the Watcher starts with an empty Set (no
// domains: every request passes unlimited) instead of failing. A missing
// path is waited for: the nearest directory above it that exists is
// watched, and the rules are loaded when path appears, a reload reported
// as any other. Later, rules that go missing are a failed reload, as
// without the option: the Set in force stays.
func WithAbsent() WatchOption {
	return func(w *Watcher) { w.absentOK = true }
}

// NewWatcher loads the rules at path (a file or a directory, as Load reads
// them) and watches them. It returns the error of the first load, and
// starts nothing, if that fails.
//
// After each reload, onReload (if not nil) receives the new Set and a nil
// error, or a nil Set and the error (the rules' Errors, including the
// refusals of a WithCheck option, or why the files could not be read or
// watched) while the previous Set stays in force. It
// is called from the Watcher's goroutine, one call at a time, and must not
// call Close. A reload whose files are unchanged since the last good one
// is not reported, unless the reload before it failed.
func NewWatcher(path string, onReload func(*Set, error), opts ...WatchOption) (*Watcher, error) {
	return Loader{}.Watch(path, onReload, opts...)
}

// Watch is NewWatcher with ld reading the rules, at the first load and at
// every reload.
func (ld Loader) Watch(path string, onReload func(*Set, error), opts ...WatchOption) (*Watcher, error) {
	w := &Watcher{ld: ld, path: path, dir: path, onReload: onReload,
		done: make(chan struct{}), stopped: make(chan struct{}), reloads: make(chan chan error)}
	for _, o := range opts {
		o(w)
	}
	fi, err := os.Stat(path)
	if err != nil && !(w.absentOK && errors.Is(err, fs.ErrNotExist)) {
		return nil, fmt.Errorf("watch rules %s: %w", path, err)
	}
	if fi != nil && !fi.IsDir() {
		w.dir, w.file = filepath.Dir(path), filepath.Base(path)
	}
	w.fw, err = fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch rules %s: %w", path, err)
	}
	if fi == nil { // absent: wait for it
		if err := w.watchAbove(); err != nil {
			w.fw.Close()
			return nil, fmt.Errorf("watch rules %s: %w", path, err)
		}
		w.absent.Store(true)
		w.cur.Store(&Set{})
		go w.loop()
		return w, nil
	}
	// Watch before the first load, so that no change falls between them.
	if err := w.fw.Add(w.dir); err != nil {
		w.fw.Close()
		return nil, fmt.Errorf("watch rules %s: %w", path, err)
	}
	if err := w.watchTree(); err != nil {
		w.fw.Close()
		return nil, fmt.Errorf("watch rules %s: %w", path, err)
	}
	s, err := w.load()
	if err != nil && w.absentOK && isNoRules(err) {
		s, err = &Set{}, nil
	}
	if err != nil {
		w.fw.Close()
		return nil, err
	}
	w.cur.Store(s)
	go w.loop()
	return w, nil
}

// Absent reports whether the rules path did not exist when the Watcher
// last looked (only with WithAbsent): the Set in force is then empty.
func (w *Watcher) Absent() bool { return w.absent.Load() }

// watchAbove watches the nearest directory above the absent path that
// exists, so that the path's appearance, or that of a directory on the
// way to it, is seen.
func (w *Watcher) watchAbove() error {
	abs, err := filepath.Abs(w.path)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		err := w.fw.Add(d)
		if err == nil {
			w.above = append(w.above, d)
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return err
		}
	}
}

// appear looks again for the absent path: when it is there, it leaves
// the directories above it and watches the path as Watch does, and
// reports true; when not, it watches the nearest directory above it.
func (w *Watcher) appear() (bool, error) {
	fi, err := os.Stat(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, w.watchAbove()
	}
	if err != nil {
		return false, err
	}
	for _, d := range w.above {
		_ = w.fw.Remove(d) // gone already, or watched again below
	}
	w.above = nil
	if !fi.IsDir() {
		w.dir, w.file = filepath.Dir(w.path), filepath.Base(w.path)
	}
	if err := w.fw.Add(w.dir); err != nil {
		return false, err
	}
	w.absent.Store(false)
	return true, nil
}

// Current returns the Set in force: the last one that loaded without
// error. It never blocks and never returns nil.
func (w *Watcher) Current() *Set { return w.cur.Load() }

// Close stops watching and waits for the Watcher's goroutine to return;
// no onReload call runs after Close returns. Current keeps answering.
// Close is safe to call more than once.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		close(w.done)
		<-w.stopped
		if cerr := w.fw.Close(); cerr != nil {
			err = fmt.Errorf("watch rules %s: %w", w.path, cerr)
		}
	})
	return err
}

// ErrClosed is Reload's error after Close.
var ErrClosed = errors.New("rules watcher closed")

// Reload loads the rules now, as a change seen would (SIGHUP asks it of a
// server): for what the watch cannot see, such as a file behind a symbolic
// link in another directory or a file system without notifications. It
// waits for the load and returns why the Set in force stays, if it does
// (the error onReload is given too). Rules unchanged since the last good
// load are not reported, as after a change seen.
func (w *Watcher) Reload() error {
	answer := make(chan error, 1)
	select {
	case w.reloads <- answer:
	case <-w.done:
		return ErrClosed
	}
	select {
	case err := <-answer:
		return err
	case <-w.stopped:
		return ErrClosed
	}
}

// loop waits for changes, debounces them and reloads, until Close.
func (w *Watcher) loop() {
	defer close(w.stopped)
	timer := time.NewTimer(debounce)
	timer.Stop()
	defer timer.Stop()
	failed := false
	for {
		select {
		case <-w.done:
			return
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if w.relevant(ev.Name) {
				timer.Reset(debounce)
			}
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			// An overflow loses events: reload to be sure, and say why.
			w.report(nil, fmt.Errorf("watch rules %s: %w", w.path, err))
			failed = true
			timer.Reset(debounce)
		case <-timer.C:
			_ = w.reload(&failed)
		case answer := <-w.reloads:
			answer <- w.reload(&failed)
		}
	}
}

// reload loads the rules again and swaps them in when they changed, or
// when the last load failed (*failed, which it updates), reporting each
// load that changed something or failed. It returns the load's error.
func (w *Watcher) reload(failed *bool) error {
	fail := func(err error) error {
		*failed = true
		w.report(nil, err)
		return err
	}
	if w.absent.Load() {
		there, err := w.appear()
		if err != nil {
			return fail(fmt.Errorf("watch rules %s: %w", w.path, err))
		}
		if !there {
			return nil // still absent: the empty Set stays, as at the start
		}
	}
	if err := w.watchTree(); err != nil {
		return fail(fmt.Errorf("watch rules %s: %w", w.path, err))
	}
	s, err := w.load()
	switch {
	case err != nil:
		return fail(err)
	case s.Version() != w.cur.Load().Version() || *failed:
		*failed = false
		w.cur.Store(s)
		w.report(s, nil)
	}
	return nil
}

// load loads the rules and checks them.
func (w *Watcher) load() (*Set, error) {
	s, err := w.ld.Load(w.path)
	if err != nil {
		return nil, err
	}
	if err := s.Check(w.check); err != nil {
		return nil, err
	}
	return s, nil
}

func (w *Watcher) report(s *Set, err error) {
	if w.onReload == nil {
		return
	}
	select {
	case <-w.done:
		return // closing: no more calls
	default:
	}
	w.onReload(s, err)
}

// watchTree watches, in the Loader's EnvoyLayout, every directory below
// the watched one that the Loader reads, so that changes in
// subdirectories are seen; directories already watched stay so, and
// removed ones leave the watch by themselves.
func (w *Watcher) watchTree() error {
	if !w.ld.EnvoyLayout || w.file != "" {
		return nil
	}
	// A symbolic link on the way to the directory, such as Envoy's
	// runtime root /srv/runtime_data/current, is swapped to publish new
	// rules: watch the directory that holds it, and the directory it
	// leads to now.
	if err := w.watchLinks(); err != nil {
		return err
	}
	root, err := filepath.EvalSymlinks(w.dir)
	if err != nil {
		return err
	}
	if err := w.fw.Add(root); err != nil {
		return err
	}
	return filepath.WalkDir(root, func(name string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking: its parent's event reloads
			}
			return err
		}
		if !e.IsDir() || name == root {
			return nil
		}
		if w.ld.IgnoreDotFiles && strings.HasPrefix(e.Name(), ".") {
			return filepath.SkipDir
		}
		if err := w.fw.Add(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// watchLinks watches the directories that hold the symbolic links on the
// way to the watched directory (resolving each link before the next).
func (w *Watcher) watchLinks() error {
	abs, err := filepath.Abs(w.dir)
	if err != nil {
		return err
	}
	parts := strings.Split(strings.TrimPrefix(abs, string(filepath.Separator)), string(filepath.Separator))
	cur := string(filepath.Separator)
	for hops := 0; len(parts) > 0; {
		next := filepath.Join(cur, parts[0])
		parts = parts[1:]
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return fmt.Errorf("%s: too many symbolic links", w.dir)
		}
		if err := w.fw.Add(cur); err != nil {
			return err
		}
		target, err := os.Readlink(next)
		if err != nil {
			return err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target)
		}
		// Walk the link's target from the top again, in case it holds
		// links of its own.
		rest := strings.Split(strings.TrimPrefix(filepath.Clean(target), string(filepath.Separator)), string(filepath.Separator))
		parts = append(rest, parts...)
		cur = string(filepath.Separator)
	}
	return nil
}

// relevant reports whether a change to the named entry of the watched
// directory may change the rules: the rules file itself, a *.yaml or *.yml
// file of a watched directory, or Kubernetes' ..data symlink and
// ..timestamped directories.
func (w *Watcher) relevant(name string) bool {
	if w.absent.Load() { // a directory above the path: its way to it
		abs, err := filepath.Abs(w.path)
		return err == nil && (name == abs || strings.HasPrefix(abs, name+string(filepath.Separator)))
	}
	base := filepath.Base(name)
	if strings.HasPrefix(base, "..") {
		return true
	}
	if w.ld.EnvoyLayout && w.file == "" {
		return !w.ld.IgnoreDotFiles || !strings.HasPrefix(base, ".")
	}
	if w.file != "" {
		return base == w.file
	}
	return isRulesFile(base)
}
