package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/server"
)

func checkCommand(getenv func(string) string, stdout, stderr io.Writer) *ff.Command {
	s := newSettings(forRules) // only how rules are read
	var identityPath, store string
	fs := ff.NewFlagSet("check")
	fs.StringVar(&identityPath, 0, "identity", "", "an identity file to check as well, or alone")
	s.register(fs, forRules)
	fs.StringVar(&store, 0, "store", "memory", withEnv("store", "the store the rules are for, as serve's --store: memory or a redis URL"))
	return &ff.Command{
		Name:      "check",
		Usage:     "sluice check [--store URL] [--identity FILE] FILE|DIR",
		ShortHelp: "validate rules and identity files",
		LongHelp: "Loads the rules as serve would and prints every mistake as file:line: message,\n" +
			"exiting with status 1 if there is any. Without an argument, checks $SLUICE_RULES.\n" +
			"With --store, a limit that store cannot apply is a mistake too (the store is not contacted).\n" +
			"With --identity, checks that identity file too (or alone, given no rules), and warns of\n" +
			"settings that leave a way around the limits, such as requests that yield no descriptor.",
		Flags: fs,
		Exec: func(_ context.Context, args []string) error {
			path := getenv(envKey("rules"))
			switch {
			case len(args) == 1:
				path = args[0]
			case len(args) > 1:
				return usageError("check: want one FILE or DIR, got %d arguments", len(args))
			case path == "" && identityPath == "":
				return usageError("check: want a FILE or DIR")
			}
			var domain string
			if identityPath != "" {
				var err error
				if domain, err = checkIdentity(identityPath, stdout, stderr); err != nil || path == "" {
					return err
				}
			}
			limits, err := server.LimitCheck(store)
			if err != nil {
				return usageError("check: %v", err)
			}
			round, share := server.RegionRound(s.cfg.Store.RegionSyncInterval, s.cfg.Store.RegionShare)
			return check(s.cfg.Rules.Loader(), path, limits, server.SyncInterval(s.cfg.Store.SyncInterval), pace{round, share}, domain, stdout, stderr)
		},
	}
}

// check loads the rules at path with ld, checks their limits with limits
// unless it is nil (the store's veto, as serve applies it), and reports
// each mistake on its own line of stderr as file:line: message, or a
// summary of the rules on stdout.
// pace is the regions layer's round and share, for the warnings of
// global limits.
type pace struct {
	round time.Duration
	share int64
}

func check(ld rules.Loader, path string, limits func(sluice.Limit) error, interval time.Duration, regions pace, domain string, stdout, stderr io.Writer) error {
	set, err := ld.Load(path)
	if err == nil {
		err = set.Check(limits)
	}
	if err != nil {
		var es rules.Errors
		if !errors.As(err, &es) {
			return err
		}
		if _, ierr := identity.Load(path); ierr == nil {
			return &exitError{code: 1, msg: fmt.Sprintf("check %s: an identity file, not rules: check it with sluice check --identity %s", path, path)}
		}
		for _, e := range es {
			fmt.Fprintln(stderr, e.Error())
		}
		noun := "mistakes"
		if len(es) == 1 {
			noun = "mistake"
		}
		return &exitError{code: 1, msg: fmt.Sprintf("check %s: %d %s", path, len(es), noun)}
	}
	for _, w := range slices.Concat(set.Warnings(), set.PaceWarnings(interval), set.GlobalWarnings(regions.round, regions.share)) {
		fmt.Fprintf(stderr, "warning: %v\n", w)
	}
	domains := set.Domains()
	if domain != "" && !slices.Contains(domains, domain) {
		fmt.Fprintf(stderr, "warning: %s: no rules for the identity file's domain %s: every request passes\n", path, domain)
	}
	fmt.Fprintf(stdout, "%s: ok: %d domain(s): %s (version %s)\n", path, len(domains), strings.Join(domains, ", "), set.Version())
	return nil
}

// checkIdentity checks the identity file at path: its mistakes as
// file:line: message on stderr (then an exitError), its warnings as
// "warning: file:line: ...", and a summary on stdout. It returns the
// file's domain.
func checkIdentity(path string, stdout, stderr io.Writer) (string, error) {
	c, ws, err := identity.LintFile(path)
	if err != nil {
		var ce *identity.ConfigError
		if !errors.As(err, &ce) {
			return "", err
		}
		fmt.Fprintln(stderr, ce.Error())
		return "", &exitError{code: 1, msg: fmt.Sprintf("check %s: 1 mistake", path)}
	}
	for _, w := range ws {
		fmt.Fprintf(stderr, "warning: %v\n", w)
	}
	fmt.Fprintf(stdout, "%s: ok: identity for domain %s, %d rate limit(s), %d warning(s)\n", path, c.Domain, len(c.RateLimits), len(ws))
	return c.Domain, nil
}
