package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// reload is one call of a Watcher's onReload.
type reload struct {
	set *Set
	err error
}

// watch starts a Watcher on path whose reloads arrive on the returned
// channel, and closes it when the test ends.
func watch(t *testing.T, path string) (*Watcher, <-chan reload) {
	t.Helper()
	ch := make(chan reload, 64)
	w, err := NewWatcher(path, func(s *Set, err error) { ch <- reload{s, err} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	})
	return w, ch
}

// next waits for the next reload, up to a bound that only a lost event
// reaches.
func next(t *testing.T, ch <-chan reload) reload {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
		return reload{}
	}
}

// rate returns the rate of the rule that user=alice matches in domain api.
func rate(t *testing.T, s *Set) int64 {
	t.Helper()
	r, err := s.Match("api", []Entry{{Key: "user", Value: "alice"}})
	if err != nil || r == nil {
		t.Fatalf("Match(api, user=alice) = %v, %v", r, err)
	}
	return r.Limits[0].Limit.Rate
}

func rulesWithRate(n int) string {
	return fmt.Sprintf("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

const broken = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 0}\n"

// TestWatcherEdits edits a rules file in place and by rename, as editors
// do, watching the file and its directory: a good edit takes effect, a
// broken one is reported with its errors while the old rules stay in force.
func TestWatcherEdits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		watch func(dir string) string
	}{
		{"file", func(dir string) string { return filepath.Join(dir, "rules.yaml") }},
		{"directory", func(dir string) string { return dir }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			file := filepath.Join(dir, "rules.yaml")
			write(t, file, rulesWithRate(1))
			w, ch := watch(t, tt.watch(dir))
			if got := rate(t, w.Current()); got != 1 {
				t.Fatalf("initial rate %d, want 1", got)
			}

			// A good edit in place.
			write(t, file, rulesWithRate(2))
			r := next(t, ch)
			if r.err != nil {
				t.Fatalf("good edit: %v", r.err)
			}
			if rate(t, r.set) != 2 || w.Current() != r.set {
				t.Fatalf("after a good edit: rate %d, Current is the new Set: %v", rate(t, w.Current()), w.Current() == r.set)
			}

			// A broken edit: reported, and the old rules stay.
			write(t, file, broken)
			r = next(t, ch)
			var errs Errors
			if !errors.As(r.err, &errs) || r.set != nil {
				t.Fatalf("broken edit: reload %v, %v; want Errors", r.set, r.err)
			}
			if !strings.Contains(r.err.Error(), "rules.yaml:4: unit: unknown unit") {
				t.Errorf("broken edit errors %q, want the file:line of the unit", r.err)
			}
			if got := rate(t, w.Current()); got != 2 {
				t.Fatalf("after a broken edit: rate %d, want the old 2", got)
			}

			// An editor's write to a temporary file renamed over the old.
			tmp := filepath.Join(dir, ".rules.yaml.swp")
			write(t, tmp, rulesWithRate(3))
			if err := os.Rename(tmp, file); err != nil {
				t.Fatal(err)
			}
			r = next(t, ch)
			if r.err != nil || rate(t, r.set) != 3 || rate(t, w.Current()) != 3 {
				t.Fatalf("rename-write: reload %v, %v; want rate 3", r.set, r.err)
			}
		})
	}
}

// TestWatcherConfigMap updates rules the way the kubelet updates a mounted
// ConfigMap: the files are symlinks through ..data to a timestamped
// directory, and an update writes a new directory, points ..data at it by
// renaming a new symlink over it, and removes the old directory.
func TestWatcherConfigMap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		watch func(dir string) string
	}{
		{"mounted file", func(dir string) string { return filepath.Join(dir, "rules.yaml") }},
		{"mounted directory", func(dir string) string { return dir }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			version := func(n int, data string) string {
				ts := fmt.Sprintf("..2026_11_21_23_00_%02d.%09d", n, n)
				write(t, filepath.Join(dir, ts, "rules.yaml"), data)
				return ts
			}
			swap := func(ts string) {
				tmp := filepath.Join(dir, "..data_tmp")
				symlink(t, ts, tmp)
				if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
					t.Fatal(err)
				}
			}
			old := version(1, rulesWithRate(1))
			symlink(t, old, filepath.Join(dir, "..data"))
			symlink(t, "..data/rules.yaml", filepath.Join(dir, "rules.yaml"))
			w, ch := watch(t, tt.watch(dir))
			if got := rate(t, w.Current()); got != 1 {
				t.Fatalf("initial rate %d, want 1", got)
			}

			// Readers keep matching, without blocking, during the updates.
			stop := make(chan struct{})
			var readers sync.WaitGroup
			for range 2 {
				readers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if r, err := w.Current().Match("api", []Entry{{Key: "user", Value: "bob"}}); err != nil || r == nil {
							t.Errorf("a reader saw no rule: %v, %v", r, err)
							return
						}
					}
				})
			}
			defer func() { close(stop); readers.Wait() }()

			next2 := version(2, rulesWithRate(20))
			swap(next2)
			if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
				t.Fatal(err)
			}
			r := next(t, ch)
			if r.err != nil || rate(t, r.set) != 20 || rate(t, w.Current()) != 20 {
				t.Fatalf("ConfigMap update: reload %v, %v; want rate 20", r.set, r.err)
			}

			// A broken ConfigMap: reported, the old rules stay.
			bad := version(3, broken)
			swap(bad)
			r = next(t, ch)
			if r.err == nil || rate(t, w.Current()) != 20 {
				t.Fatalf("broken ConfigMap: reload %v, %v, rate %d; want errors and rate 20", r.set, r.err, rate(t, w.Current()))
			}

			// Fixed again.
			swap(version(4, rulesWithRate(40)))
			r = next(t, ch)
			if r.err != nil || rate(t, w.Current()) != 40 {
				t.Fatalf("fixed ConfigMap: reload %v, %v; want rate 40", r.set, r.err)
			}
		})
	}
}

// TestWatcherClose checks that a Watcher whose first load fails starts
// nothing, that Close may be called twice, and that no reload is reported
// after Close returns.
func TestWatcherClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write(t, file, broken)
	if w, err := NewWatcher(file, nil); err == nil {
		w.Close()
		t.Fatal("NewWatcher on broken rules: no error")
	}
	if _, err := NewWatcher(filepath.Join(dir, "missing.yaml"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("NewWatcher on a missing file: %v, want os.ErrNotExist", err)
	}

	write(t, file, rulesWithRate(1))
	var mu sync.Mutex
	closed := false
	w, err := NewWatcher(file, func(*Set, error) {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			t.Error("onReload called after Close returned")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	write(t, file, rulesWithRate(2)) // a reload may be under way while closing
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	closed = true
	mu.Unlock()
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if w.Current() == nil {
		t.Fatal("Current after Close is nil")
	}
}

// TestWatcherSizeCap grows a watched rules file past a Loader's cap: the
// reload is refused with the cap named and the rules in force stay.
func TestWatcherSizeCap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write(t, path, rulesWithRate(5))
	ch := make(chan reload, 64)
	w, err := Loader{MaxFileBytes: 1000}.Watch(path, func(s *Set, err error) { ch <- reload{s, err} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write(t, path, rulesWithRate(7)+"#"+strings.Repeat("x", 1000)+"\n")
	if r := next(t, ch); r.err == nil || !strings.Contains(r.err.Error(), "above the cap of 1000 bytes") {
		t.Fatalf("reload of a file over the cap: %v, %v; want the cap named", r.set, r.err)
	}
	if got := rate(t, w.Current()); got != 5 {
		t.Errorf("rate in force %d, want 5 (the last good rules)", got)
	}
	write(t, path, rulesWithRate(7))
	if r := next(t, ch); r.err != nil || rate(t, r.set) != 7 {
		t.Errorf("reload under the cap: %v; want rate 7", r.err)
	}
}

// TestWatcherEnvoyLayout watches a directory in the EnvoyLayout: a file
// written in a subdirectory, and a new subdirectory with a file, are both
// seen.
func TestWatcherEnvoyLayout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "sub", "api"), rulesWithRate(5))
	ch := make(chan reload, 64)
	w, err := Loader{EnvoyLayout: true}.Watch(dir, func(s *Set, err error) { ch <- reload{s, err} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write(t, filepath.Join(dir, "sub", "api"), rulesWithRate(6))
	if r := next(t, ch); r.err != nil || rate(t, r.set) != 6 {
		t.Fatalf("edit in a subdirectory: %v", r.err)
	}
	// A new directory two levels deep, then a file in it: the directory's
	// creation makes a reload that watches it, and reads the file if it is
	// already there; if not, its creation in the watched directory does.
	if err := os.MkdirAll(filepath.Join(dir, "new", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "new", "deeper", "web"), "domain: web\n")
	for {
		r := next(t, ch)
		if r.err != nil {
			t.Fatalf("a new subdirectory: %v", r.err)
		}
		if len(r.set.Domains()) == 2 {
			return
		}
	}
}

// TestWatcherEnvoySymlinkSwap publishes new rules as Envoy's runtime is
// published: by swapping the symbolic link the runtime root is
// (/srv/runtime_data/current) to a new directory, atomically by rename.
func TestWatcherEnvoySymlinkSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "v1", "ratelimit", "config", "api"), rulesWithRate(5))
	write(t, filepath.Join(dir, "v2", "ratelimit", "config", "api"), rulesWithRate(7))
	symlink(t, "v1", filepath.Join(dir, "current"))
	ch := make(chan reload, 64)
	w, err := Loader{EnvoyLayout: true}.Watch(filepath.Join(dir, "current", "ratelimit", "config"), func(s *Set, err error) { ch <- reload{s, err} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := rate(t, w.Current()); got != 5 {
		t.Fatalf("rate %d, want 5", got)
	}
	symlink(t, "v2", filepath.Join(dir, "current.new"))
	if err := os.Rename(filepath.Join(dir, "current.new"), filepath.Join(dir, "current")); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); r.err != nil || rate(t, r.set) != 7 {
		t.Fatalf("after the swap: %v", r.err)
	}
	// And edits in the new directory are seen.
	write(t, filepath.Join(dir, "v2", "ratelimit", "config", "api"), rulesWithRate(9))
	if r := next(t, ch); r.err != nil || rate(t, r.set) != 9 {
		t.Fatalf("an edit after the swap: %v", r.err)
	}
}

// TestWatcherAbsent starts, as Envoy's ratelimit does, without the rules:
// with WithAbsent, a runtime root that does not exist yet, or a directory
// without files, is an empty Set, and the rules are loaded when they
// appear; without it, both are errors.
func TestWatcherAbsent(t *testing.T) {
	t.Parallel()
	envoy := Loader{EnvoyLayout: true}
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "current", "ratelimit", "config")
		if _, err := envoy.Watch(path, nil); err == nil {
			t.Fatal("a missing directory watched without WithAbsent")
		}
		ch := make(chan reload, 64)
		w, err := envoy.Watch(path, func(s *Set, err error) { ch <- reload{s, err} }, WithAbsent())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if !w.Absent() || len(w.Current().Domains()) != 0 {
			t.Fatalf("Absent() = %v, domains %v; want true and none", w.Absent(), w.Current().Domains())
		}
		// Published as Envoy's runtime is: a new directory, then the
		// symbolic link the runtime root is, made in a directory above.
		write(t, filepath.Join(dir, "v1", "ratelimit", "config", "api"), rulesWithRate(5))
		symlink(t, "v1", filepath.Join(dir, "current"))
		r := next(t, ch)
		if r.err != nil || rate(t, r.set) != 5 || w.Absent() {
			t.Fatalf("rules published: %v (absent %v)", r.err, w.Absent())
		}
		// Watched as any runtime directory from then on.
		write(t, filepath.Join(dir, "v1", "ratelimit", "config", "api"), rulesWithRate(6))
		if r := next(t, ch); r.err != nil || rate(t, r.set) != 6 {
			t.Fatalf("edit after the rules appeared: %v", r.err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		if _, err := envoy.Watch(dir, nil); err == nil || !strings.Contains(err.Error(), "no rules") {
			t.Fatalf("an empty directory without WithAbsent: %v, want no rules", err)
		}
		ch := make(chan reload, 64)
		w, err := envoy.Watch(dir, func(s *Set, err error) { ch <- reload{s, err} }, WithAbsent())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if w.Absent() || len(w.Current().Domains()) != 0 {
			t.Fatalf("Absent() = %v, domains %v; want false and none", w.Absent(), w.Current().Domains())
		}
		write(t, filepath.Join(dir, "api"), rulesWithRate(5))
		if r := next(t, ch); r.err != nil || rate(t, r.set) != 5 {
			t.Fatalf("rules written: %v", r.err)
		}
	})
	t.Run("deeper", func(t *testing.T) {
		t.Parallel()
		// Two directories missing: the nearer one's creation moves the
		// watch down (or finds the path there already); the rules file's
		// makes the reload.
		dir := t.TempDir()
		path := filepath.Join(dir, "a", "b")
		ch := make(chan reload, 64)
		w, err := Loader{}.Watch(path, func(s *Set, err error) { ch <- reload{s, err} }, WithAbsent())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(path, "api.yaml"), rulesWithRate(5))
		for {
			r := next(t, ch)
			if r.err == nil && rate(t, r.set) == 5 {
				return
			}
		}
	})
}

// TestWatcherReload: Reload loads what the watch cannot see (a rules file
// behind a symbolic link to another directory, edited there), reports it,
// keeps the rules in force when the edit is broken, and says ErrClosed
// after Close.
func TestWatcherReload(t *testing.T) {
	t.Parallel()
	real, dir := t.TempDir(), t.TempDir()
	target, path := filepath.Join(real, "rules.yaml"), filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(target, []byte(rulesWithRate(1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	w, ch := watch(t, path)
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload of unchanged rules: %v", err)
	}
	if err := os.WriteFile(target, []byte(rulesWithRate(2)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := rate(t, w.Current()); got != 2 {
		t.Errorf("after Reload: rate %d, want 2", got)
	}
	if r := next(t, ch); r.err != nil || rate(t, r.set) != 2 {
		t.Errorf("reported %v, %v; want the rules of rate 2", r.set, r.err)
	}
	if err := os.WriteFile(target, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err == nil {
		t.Error("Reload of broken rules: no error")
	}
	if got := rate(t, w.Current()); got != 2 {
		t.Errorf("after a broken Reload: rate %d, want 2 still", got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); !errors.Is(err, ErrClosed) {
		t.Errorf("Reload after Close: %v, want ErrClosed", err)
	}
}
