package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/control/filedb"
	"github.com/sluicehq/sluice/control/redisdb"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/rules"
)

// rulesDBFlags are the flags of a rules database (--rules redis://...).
type rulesDBFlags struct {
	snapshot string
	poll     time.Duration
}

func (c *rulesDBFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&c.snapshot, 0, "rules-snapshot", "", withEnv("rules-snapshot", "with --rules redis://...: file keeping the last good rules, from which a node starts while the database is down"))
	fs.DurationVar(&c.poll, 0, "rules-poll", control.DefaultPoll, withEnv("rules-poll", "with --rules redis://..., or a rules directory's overrides: how often the generation is read in case a change was missed (negative: never)"))
}

// isRulesDB reports whether --rules names a rules database (a Redis URL)
// rather than files.
func isRulesDB(spec string) bool {
	for _, p := range []string{"redis://", "rediss://", "redis+cluster://", "rediss+cluster://", "redis+sentinel://", "unix://"} {
		if strings.HasPrefix(strings.ToLower(spec), p) {
			return true
		}
	}
	return false
}

// rulesSource is where a node's rules come from: a rules.Watcher of files
// or a control.Retriever of a rules database.
type rulesSource interface {
	Current() *rules.Set
}

// openRules opens the rules --rules names, with the store's veto check,
// counting reloads in m and rm and telling onReload of each after the
// first load. It returns the source, the rules database the admin API
// writes (control/filedb for a directory of rules files, nil for one
// file) and how to close both.
func openRules(log *slog.Logger, c coreFlags, check func(sluice.Limit) error, m *metrics.Metrics, rm *metrics.RulesSource, onReload func(*rules.Set, error)) (rulesSource, control.DB, func() error, error) {
	report := func(set *rules.Set, source string, gen int64, err error) {
		m.Reload(err)
		rm.Reload(set, source, gen, err)
		onReload(set, err)
		if err != nil {
			log.Error("rules reload failed; the rules in force stay", "rules", redactURL(c.rules), "source", source, "err", err)
			return
		}
		log.Info("rules reloaded", "rules", redactURL(c.rules), "source", source, "version", set.Version(), "generation", gen,
			"domains", set.Domains(), "overrides", set.NumOverrides())
	}
	if !isRulesDB(c.rules) {
		return openRulesFiles(c, check, m, rm, onReload, report)
	}
	var tc *tls.Config
	if strings.HasPrefix(strings.ToLower(c.rules), "rediss") { // the store's TLS flags serve a rules database in TLS too
		var err error
		if tc, err = c.storeTLS.config(c.rules); err != nil {
			return nil, nil, nil, err
		}
	}
	db, err := redisdb.Open(c.rules, redisdb.Config{TLS: tc})
	if err != nil {
		return nil, nil, nil, usageError("--rules: %v", err)
	}
	r, err := control.NewRetriever(context.Background(), control.RetrieverConfig{
		DB: db, Loader: c.loader(), Check: check, Snapshot: c.db.snapshot, Poll: c.db.poll, OnReload: report,
	})
	if err != nil { // OnReload counted the failure
		return nil, nil, nil, errors.Join(fmt.Errorf("load rules: %w", err), db.Close())
	}
	return r, db, func() error { return errors.Join(r.Close(), db.Close()) }, nil
}

// openRulesFiles opens rules files and their watcher. For a directory, the
// overrides the admin API keeps in it (control/filedb) are applied by a
// control.Retriever whose Base is the watcher's rules: it rebuilds the Set
// when the files change, when an override is set or deleted (at once in
// this process, at the next --rules-poll for another) and when one ends.
func openRulesFiles(c coreFlags, check func(sluice.Limit) error, m *metrics.Metrics, rm *metrics.RulesSource,
	onReload func(*rules.Set, error), report func(*rules.Set, string, int64, error)) (rulesSource, control.DB, func() error, error) {
	db, dbErr := filedb.Open(c.rules, c.loader()) // an error: one file, or hidden files read as rules; no overrides
	var retr atomic.Pointer[control.Retriever]
	w, err := c.loader().Watch(c.rules, func(set *rules.Set, err error) {
		switch r := retr.Load(); {
		case err != nil || dbErr != nil:
			report(set, control.SourceFiles, 0, err)
		case r != nil:
			r.Rebase() // reports the rules with the overrides
		}
	}, rules.WithCheck(check))
	if err != nil {
		m.Reload(err)
		return nil, nil, nil, fmt.Errorf("load rules: %w", err)
	}
	var src rulesSource = w
	closeAll := w.Close
	var gen int64
	if dbErr == nil {
		r, err := control.NewRetriever(context.Background(), control.RetrieverConfig{
			DB: db, Loader: c.loader(), Check: check, Base: w.Current, Poll: c.db.poll,
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
		src, closeAll = r, func() error { return errors.Join(r.Close(), w.Close()) }
	}
	m.Reload(nil)
	rm.Reload(src.Current(), control.SourceFiles, gen, nil)
	onReload(src.Current(), nil)
	if dbErr != nil {
		return src, nil, closeAll, nil // not a nil *filedb.DB in a control.DB
	}
	return src, db, closeAll, nil
}
