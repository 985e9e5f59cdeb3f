package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

func checkCommand(getenv func(string) string, stdout, stderr io.Writer) *ff.Command {
	var c coreFlags // only --max-rules-size and --store
	fs := ff.NewFlagSet("check")
	fs.IntVar(&c.maxRulesSize, 0, "max-rules-size", rules.DefaultMaxFileBytes, "largest rules file read, in bytes (16 MiB); a directory may hold 4 times as much")
	fs.StringVar(&c.store, 0, "store", "memory", withEnv("store", "the store the rules are for, as serve's --store: memory or a redis URL"))
	return &ff.Command{
		Name:      "check",
		Usage:     "sluice check [--store URL] FILE|DIR",
		ShortHelp: "validate rules files",
		LongHelp: "Loads the rules as serve would and prints every mistake as file:line: message,\n" +
			"exiting with status 1 if there is any. Without an argument, checks $SLUICE_RULES.\n" +
			"With --store, a limit that store cannot apply is a mistake too (the store is not contacted).",
		Flags: fs,
		Exec: func(_ context.Context, args []string) error {
			path := getenv(envKey("rules"))
			switch {
			case len(args) == 1:
				path = args[0]
			case len(args) > 1:
				return usageError("check: want one FILE or DIR, got %d arguments", len(args))
			case path == "":
				return usageError("check: want a FILE or DIR")
			}
			limits, err := limitCheck(c.store)
			if err != nil {
				return usageError("check: %v", err)
			}
			return check(c.loader(), path, limits, stdout, stderr)
		},
	}
}

// check loads the rules at path with ld, checks their limits with limits
// unless it is nil (the store's veto, as serve applies it), and reports
// each mistake on its own line of stderr as file:line: message, or a
// summary of the rules on stdout.
func check(ld rules.Loader, path string, limits func(sluice.Limit) error, stdout, stderr io.Writer) error {
	set, err := ld.Load(path)
	if err == nil {
		err = set.Check(limits)
	}
	if err != nil {
		var es rules.Errors
		if !errors.As(err, &es) {
			return err
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
	domains := set.Domains()
	fmt.Fprintf(stdout, "%s: ok: %d domain(s): %s (version %s)\n", path, len(domains), strings.Join(domains, ", "), set.Version())
	return nil
}
