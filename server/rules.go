package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/control/redisdb"
	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/stack"
)

// Loader returns the rules loader c asks for (what `sluice check` reads with too): a cap of MaxFileBytes on a
// file and 4 times that on a directory.
func (c RulesConfig) Loader() rules.Loader {
	return rules.Loader{MaxFileBytes: int64(c.MaxFileBytes), MaxTotalBytes: 4 * int64(c.MaxFileBytes),
		EnvoyLayout: c.EnvoyLayout, IgnoreDotFiles: c.IgnoreDotFiles, MergeDomains: c.MergeDomains}
}

// isRulesDB reports whether a rules source names a rules database (a Redis
// URL) rather than files.
func isRulesDB(spec string) bool {
	for _, p := range []string{"redis://", "rediss://", "redis+cluster://", "rediss+cluster://", "redis+sentinel://", "unix://"} {
		if strings.HasPrefix(strings.ToLower(spec), p) {
			return true
		}
	}
	return false
}

// warnRules logs at Warn what in set loads but may not be meant, as
// `sluice check` prints it (rules.Set.Warnings): a requests_per_unit of 0,
// which denies every request, metrics named by clients' values.
func warnRules(log *slog.Logger, set *rules.Set) {
	for _, w := range set.Warnings() {
		log.Warn("rules warning", "warning", w.Error())
	}
}

// rulesSource is where a node's rules come from: a rules.Watcher of files,
// a control.Retriever of a rules database or an xds.Subscription.
type rulesSource interface {
	Current() *rules.Set
	// Reload reads the rules again now (Server.Reload, SIGHUP) and returns
	// why the rules in force stay, if they do.
	Reload(ctx context.Context) error
}

// SourceSignal names a reload that Server.Reload asked for (SIGHUP) in
// the logs and metrics.
const SourceSignal = "signal"

// watchedFiles are rules files alone: their watcher loads them again.
type watchedFiles struct{ *rules.Watcher }

func (w watchedFiles) Reload(context.Context) error { return w.Watcher.Reload() }

// database is a rules database: its retriever reads it again.
type database struct{ *control.Retriever }

func (d database) Reload(ctx context.Context) error { return d.Refresh(ctx, SourceSignal) }

// xdsSource is an xDS subscription: the management server sends every
// change as it happens, and has nothing to read again.
type xdsSource struct{ *xds.Subscription }

func (xdsSource) Reload(context.Context) error { return nil }

// filesWithOverrides are rules files with the overrides control/filedb
// keeps beside them: the watcher loads the files again (and its report
// rebases the retriever), the retriever reads the overrides again.
type filesWithOverrides struct {
	*control.Retriever
	w *rules.Watcher
}

func (f filesWithOverrides) Reload(ctx context.Context) error {
	return errors.Join(f.w.Reload(), f.Refresh(ctx, SourceSignal))
}

// rulesHooks are told of each rules load.
type rulesHooks struct {
	m        *metrics.Metrics
	rm       *metrics.RulesSource
	onReload func(*rules.Set, error) // after the first load
}

// openRules opens the rules c.Rules names, with the store's veto check,
// counting reloads in h and logging them. It returns the source, the
// rules database the admin API writes (control/filedb for a directory of
// rules files, nil for one file) and how to close both.
func openRules(log *slog.Logger, c Config, check func(sluice.Limit) error, h rulesHooks) (rulesSource, control.DB, func() error, error) {
	rc := c.Rules
	report := func(set *rules.Set, source string, gen int64, err error) {
		h.m.Reload(err)
		h.rm.Reload(set, source, gen, err)
		h.onReload(set, err)
		if err != nil {
			log.Error("rules reload failed; the rules in force stay", "rules", stack.Redact(rc.Source), "source", source, "err", err)
			return
		}
		log.Info("rules reloaded", "rules", stack.Redact(rc.Source), "source", source, "version", set.Version(), "generation", gen,
			"domains", set.Domains(), "overrides", set.NumOverrides())
		warnRules(log, set)
	}
	if isXDS(rc.Source) {
		sub, err := openRulesXDS(log, rc, check, h)
		if err != nil {
			return nil, nil, nil, err
		}
		return xdsSource{sub}, nil, sub.Close, nil
	}
	if !isRulesDB(rc.Source) {
		return openRulesFiles(log, rc, check, h, report)
	}
	var tc *tls.Config
	if strings.HasPrefix(strings.ToLower(rc.Source), "rediss") { // the store's TLS settings serve a rules database in TLS too
		var err error
		if tc, err = c.StoreTLS.config(rc.Source); err != nil {
			return nil, nil, nil, err
		}
	}
	db, err := redisdb.Open(rc.Source, redisdb.Config{TLS: tc, ClientOption: stack.ClientOption})
	if err != nil {
		return nil, nil, nil, configError("--rules: %v", err)
	}
	r, err := control.NewRetriever(context.Background(), control.RetrieverConfig{
		DB: db, Loader: rc.Loader(), Check: check, Snapshot: rc.Snapshot, Poll: rc.Poll, OnReload: report,
	})
	if err != nil { // OnReload counted the failure
		return nil, nil, nil, errors.Join(fmt.Errorf("load rules: %w", err), db.Close())
	}
	return database{r}, db, func() error { return errors.Join(r.Close(), db.Close()) }, nil
}

// openRulesFiles opens rules files and their watcher. For a directory, the
// overrides the admin API keeps in it (control/filedb) are applied by a
// control.Retriever whose Base is the watcher's rules: it rebuilds the Set
// when the files change, when an override is set or deleted (at once in
// this process, at the next Poll for another) and when one ends.
//
// In Envoy's layout, rules that are missing (Envoy's runtime directory not
// there yet, or empty) are no rules, with a warning, until they appear, as
// Envoy's ratelimit starts (rules.WithAbsent).
func openRulesFiles(log *slog.Logger, rc RulesConfig, check func(sluice.Limit) error, h rulesHooks,
	report func(*rules.Set, string, int64, error)) (rulesSource, control.DB, func() error, error) {
	db, dbErr := filedb.Open(rc.Source, rc.Loader()) // an error: one file, or hidden files read as rules; no overrides
	var retr atomic.Pointer[control.Retriever]
	opts := []rules.WatchOption{rules.WithCheck(check)}
	if rc.EnvoyLayout {
		opts = append(opts, rules.WithAbsent())
	}
	w, err := rc.Loader().Watch(rc.Source, func(set *rules.Set, err error) {
		switch r := retr.Load(); {
		case err != nil || dbErr != nil:
			report(set, control.SourceFiles, 0, err)
		case r != nil:
			r.Rebase() // reports the rules with the overrides
		}
	}, opts...)
	if err != nil {
		h.m.Reload(err)
		return nil, nil, nil, fmt.Errorf("load rules: %w", err)
	}
	if len(w.Current().Domains()) == 0 {
		what := "the directory has no files"
		if w.Absent() {
			what = "nothing is there"
		}
		log.Warn("no rules yet: "+what+"; every request passes unlimited until rules appear there", "rules", rc.Source)
	}
	var src rulesSource = watchedFiles{w}
	closeAll := w.Close
	var gen int64
	if dbErr == nil {
		r, err := control.NewRetriever(context.Background(), control.RetrieverConfig{
			DB: db, Loader: rc.Loader(), Check: check, Base: w.Current, Poll: rc.Poll,
			OnReload: func(set *rules.Set, source string, gen int64, err error) {
				if source != control.SourceStart || err != nil { // the start is counted below
					report(set, source, gen, err)
				}
			},
		})
		if err != nil {
			return nil, nil, nil, errors.Join(fmt.Errorf("rules overrides: %w", err), w.Close())
		}
		retr.Store(r)
		r.Rebase() // files changed before the Retriever was stored
		if st := r.State(); st != nil {
			gen = st.Generation
		}
		src, closeAll = filesWithOverrides{r, w}, func() error { return errors.Join(r.Close(), w.Close()) }
	}
	h.m.Reload(nil)
	h.rm.Reload(src.Current(), control.SourceFiles, gen, nil)
	h.onReload(src.Current(), nil)
	if dbErr != nil {
		return src, nil, closeAll, nil // not a nil *filedb.DB in a control.DB
	}
	return src, db, closeAll, nil
}
