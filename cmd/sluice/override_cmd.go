package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/admin"
)

// adminRun runs a command with an admin API client.
type adminRun func(ctx context.Context, ac *adminClient, args []string) error

// overrideCommand is `sluice override`: per-descriptor limits at run time
// through the admin API.
func overrideCommand(stdout io.Writer) *ff.Command {
	var c clientFlags
	fs := ff.NewFlagSet("override")
	c.register(fs)
	client := func(run adminRun) func(context.Context, []string) error {
		return func(ctx context.Context, args []string) error {
			ac, err := c.client()
			if err != nil {
				return err
			}
			return run(ctx, ac, args)
		}
	}
	return &ff.Command{
		Name:      "override",
		Usage:     "sluice override set|list|delete [FLAGS] ...",
		ShortHelp: "limits for one descriptor value at run time, through the admin API",
		LongHelp: "An override puts its own limit in the place of the rule a descriptor matches, for exactly\n" +
			"that descriptor (tenant=acme, or user=bob under tenant=acme), on every node, optionally for\n" +
			"a time only; its counter keeps its count where algorithm and period stay.",
		Flags: fs,
		Subcommands: []*ff.Command{
			overrideSetCommand(fs, client, stdout),
			{Name: "list", Usage: "sluice override list [DOMAIN]", ShortHelp: "list the overrides", Flags: ff.NewFlagSet("list").SetParent(fs),
				Exec: client(func(ctx context.Context, ac *adminClient, args []string) error {
					var out struct {
						Overrides []control.OverrideRecord `json:"overrides"`
					}
					if _, err := ac.doJSON(ctx, &out, "GET", "/v1/admin/overrides", nil); err != nil {
						return err
					}
					for _, o := range out.Overrides {
						if len(args) == 0 || o.Domain == args[0] {
							printOverride(stdout, o)
						}
					}
					return nil
				})},
			{Name: "delete", Usage: "sluice override delete DOMAIN KEY=VALUE...", ShortHelp: "delete an override", Flags: ff.NewFlagSet("delete").SetParent(fs),
				Exec: client(func(ctx context.Context, ac *adminClient, args []string) error {
					if len(args) < 2 {
						return usageError("override delete: want DOMAIN KEY=VALUE...")
					}
					entries, err := parseEntries(args[1:])
					if err != nil {
						return err
					}
					if _, _, err := ac.do(ctx, "DELETE", "/v1/admin/overrides/"+url.PathEscape(control.OverrideID(args[0], entries)), nil); err != nil {
						return err
					}
					fmt.Fprintf(stdout, "deleted the override of %s %s\n", args[0], strings.Join(args[1:], " "))
					return nil
				})},
		},
	}
}

// overrideSetCommand is `sluice override set`, whose flags' parent is
// parent; client gives its Exec an admin client.
func overrideSetCommand(parent *ff.FlagSet, client func(adminRun) func(context.Context, []string) error, stdout io.Writer) *ff.Command {
	var (
		limit, algorithm, ttl string
		burst                 int
		dry                   bool
	)
	fs := ff.NewFlagSet("set").SetParent(parent)
	fs.StringVar(&limit, 0, "limit", "", "the limit: REQUESTS/UNIT such as 500/second or 0/hour (blocked); UNIT second, minute, hour, day, "+
		"week, month (30 days) or year (365 days), or s, m, h, d")
	fs.StringVar(&algorithm, 0, "algorithm", "", "the limit's algorithm (the rule's default: fixed_window)")
	fs.IntVar(&burst, 0, "burst", 0, "the bucket's capacity for token_bucket and gcra")
	fs.StringVar(&ttl, 0, "for", "", "how long the override lasts, such as 1h (none: until deleted)")
	fs.BoolVar(&dry, 0, "dry-run", "check the override and change nothing")
	return &ff.Command{Name: "set", Usage: "sluice override set --limit N/UNIT [--for 1h] DOMAIN KEY=VALUE...", ShortHelp: "set an override", Flags: fs,
		Exec: client(func(ctx context.Context, ac *adminClient, args []string) error {
			if len(args) < 2 {
				return usageError("override set: want DOMAIN KEY=VALUE...")
			}
			entries, err := parseEntries(args[1:])
			if err != nil {
				return err
			}
			ls, err := parseLimit(limit)
			if err != nil {
				return err
			}
			ls.Algorithm, ls.Burst = algorithm, int64(burst)
			req := admin.OverrideRequest{Override: rules.Override{Domain: args[0], Entries: entries, Limits: []rules.RateLimitSpec{ls}}, TTL: ttl}
			body, err := json.Marshal(req)
			if err != nil {
				return err
			}
			q := ""
			if dry {
				q = "?dry_run=true"
			}
			var rec control.OverrideRecord
			if _, err := ac.doJSON(ctx, &rec, "PUT", "/v1/admin/overrides"+q, body); err != nil {
				return err
			}
			printOverride(stdout, rec)
			return nil
		})}
}

// printOverride prints one override on a line.
func printOverride(w io.Writer, o control.OverrideRecord) {
	var es []string
	for _, e := range o.Entries {
		es = append(es, e.Key+"="+e.Value)
	}
	var ls []string
	for _, l := range o.Limits {
		ls = append(ls, fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit))
	}
	until := "no expiry"
	if !o.Expires.IsZero() {
		until = "until " + o.Expires.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "%s %s: %s, %s, set by %s at %s\n", o.Domain, strings.Join(es, " "), strings.Join(ls, ", "), until, o.Author, o.Time.Format(time.RFC3339))
}

// parseEntries reads KEY=VALUE arguments, split at the first =.
func parseEntries(args []string) ([]rules.Entry, error) {
	out := make([]rules.Entry, len(args))
	for i, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, usageError("%q: want KEY=VALUE", a)
		}
		out[i] = rules.Entry{Key: k, Value: v}
	}
	return out, nil
}

// parseLimit reads N/UNIT (units as rules files name them, or s, m, h, d).
func parseLimit(s string) (rules.RateLimitSpec, error) {
	n, unit, ok := strings.Cut(s, "/")
	v, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || v < 0 || unit == "" {
		return rules.RateLimitSpec{}, usageError("--limit %q: want REQUESTS/UNIT such as 500/second", s)
	}
	if full, short := map[string]string{"s": "second", "m": "minute", "h": "hour", "d": "day"}[unit]; short {
		unit = full
	}
	return rules.RateLimitSpec{Unit: unit, RequestsPerUnit: v}, nil
}
