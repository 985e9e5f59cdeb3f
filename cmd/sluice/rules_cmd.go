package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/rules"
)

// rulesCommand is `sluice rules`: the rules of a rules database through
// the admin API.
func rulesCommand(stdout io.Writer) *ff.Command {
	var c clientFlags
	fs := ff.NewFlagSet("rules")
	c.register(fs)
	sub := func(name, usage, help string, nargs int, run func(ctx context.Context, ac *adminClient, args []string) error) *ff.Command {
		sfs := ff.NewFlagSet(name).SetParent(fs)
		return &ff.Command{Name: name, Usage: usage, ShortHelp: help, Flags: sfs,
			Exec: func(ctx context.Context, args []string) error {
				if nargs >= 0 && len(args) != nargs {
					return usageError("rules %s: want %d arguments, got %d (%s)", name, nargs, len(args), usage)
				}
				ac, err := c.client()
				if err != nil {
					return err
				}
				return run(ctx, ac, args)
			}}
	}
	var ifMatch string
	var dry, showDiff bool
	push := sub("push", "sluice rules push [--if-match ETAG] [--dry-run] FILE", "make a rules file its domain's new version", 1,
		func(ctx context.Context, ac *adminClient, args []string) error {
			return rulesPush(ctx, ac, args[0], ifMatch, dry, stdout)
		})
	push.Flags.(*ff.FlagSet).StringVar(&ifMatch, 0, "if-match", "", "the version (ETag, such as \"v3\") the domain must be at, else nothing changes")
	push.Flags.(*ff.FlagSet).BoolVar(&dry, 0, "dry-run", "say what would change and change nothing")
	history := sub("history", "sluice rules history [--diff] DOMAIN", "every version of a domain: author, time and diff", 1,
		func(ctx context.Context, ac *adminClient, args []string) error {
			return rulesHistory(ctx, ac, args[0], showDiff, stdout)
		})
	history.Flags.(*ff.FlagSet).BoolVar(&showDiff, 0, "diff", "print each version's diff")
	return &ff.Command{
		Name:      "rules",
		Usage:     "sluice rules get|push|diff|history|rollback|import [FLAGS] ...",
		ShortHelp: "read and change the rules of a rules database through the admin API",
		LongHelp: "Every change is checked by the server exactly as rules files are, and made a new version\n" +
			"of its domain with the token's name as author; `rules rollback` makes an earlier version the\n" +
			"newest. The token comes from --admin-token, $SLUICE_ADMIN_TOKEN or --admin-token-file.",
		Flags: fs,
		Subcommands: []*ff.Command{
			sub("get", "sluice rules get DOMAIN", "print a domain's rules as stored", 1,
				func(ctx context.Context, ac *adminClient, args []string) error {
					b, h, err := ac.do(ctx, "GET", "/v1/admin/domains/"+url.PathEscape(args[0]), nil)
					if err != nil {
						return err
					}
					fmt.Fprintf(stdout, "%s%s", getHeader(args[0], h.Get("ETag"), h.Get("X-Sluice-Author")), stripGetHeader(b))
					return nil
				}),
			push,
			sub("diff", "sluice rules diff FILE", "what pushing a rules file would change (a dry run)", 1,
				func(ctx context.Context, ac *adminClient, args []string) error {
					return rulesPush(ctx, ac, args[0], "", true, stdout)
				}),
			history,
			sub("rollback", "sluice rules rollback DOMAIN VERSION", "make an earlier version of a domain its newest", 2,
				func(ctx context.Context, ac *adminClient, args []string) error {
					v, err := strconv.ParseInt(strings.TrimPrefix(args[1], "v"), 10, 64)
					if err != nil || v <= 0 {
						return usageError("rules rollback: version %q: want a number such as 3", args[1])
					}
					var res control.Result
					if _, err := ac.doJSON(ctx, &res, "POST", "/v1/admin/domains/"+url.PathEscape(args[0])+"/rollback", fmt.Appendf(nil, `{"version": %d}`, v)); err != nil {
						return err
					}
					printResult(stdout, res)
					return nil
				}),
			sub("import", "sluice rules import DIR|FILE", "push every domain of rules files into the database", 1,
				func(ctx context.Context, ac *adminClient, args []string) error {
					return rulesImport(ctx, ac, args[0], stdout)
				}),
		},
	}
}

// printResult prints what a change did.
func printResult(w io.Writer, res control.Result) {
	verb := "is now"
	if res.DryRun {
		verb = "would be"
	}
	switch {
	case !res.Changed:
		fmt.Fprintf(w, "%s: unchanged (%s %s)\n", res.Doc.Domain, verb, res.Doc.ETag())
	default:
		fmt.Fprintf(w, "%s: %s version %d (ETag %s)\n%s", res.Doc.Domain, verb, res.Doc.Version, res.Doc.ETag(), res.Diff)
	}
}

// rulesPush pushes the one domain of the rules file at path.
func rulesPush(ctx context.Context, ac *adminClient, path, ifMatch string, dry bool, w io.Writer) error {
	docs, err := domainDocs(path)
	if err != nil {
		return err
	}
	if len(docs) != 1 {
		return usageError("rules push: %s holds %d domains; push one (or use rules import)", path, len(docs))
	}
	return pushDoc(ctx, ac, docs[0], ifMatch, dry, w)
}

// getHeader is the comment `sluice rules get` prints above a domain's
// document: its name, version and author (when known).
func getHeader(domain, etag, author string) string {
	if author == "" {
		return fmt.Sprintf("# %s %s\n", domain, etag)
	}
	return fmt.Sprintf("# %s %s by %s\n", domain, etag, author)
}

// getHeaders matches the comments getHeader writes at the top of a
// document (several where an older sluice stored them).
var getHeaders = regexp.MustCompile(`\A(?:# [^\n]* "v\d+"(?: by [^\n]*)?\r?\n)+`)

// stripGetHeader returns doc without the comments `sluice rules get` put
// at its top, so that what it printed, pushed back, is what it read.
func stripGetHeader(doc []byte) []byte {
	return doc[len(getHeaders.Find(doc)):]
}

func pushDoc(ctx context.Context, ac *adminClient, d domainDoc, ifMatch string, dry bool, w io.Writer) error {
	d.text = stripGetHeader(d.text)
	q := ""
	if dry {
		q = "?dry_run=true"
	}
	var res control.Result
	if _, err := ac.doJSON(ctx, &res, "PUT", "/v1/admin/domains/"+url.PathEscape(d.domain)+q, d.text, "If-Match", ifMatch); err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	printResult(w, res)
	return nil
}

// rulesHistory prints the versions of domain, newest first.
func rulesHistory(ctx context.Context, ac *adminClient, domain string, diffs bool, w io.Writer) error {
	var hist struct {
		Versions []control.HistoryEntry `json:"versions"`
	}
	if _, err := ac.doJSON(ctx, &hist, "GET", "/v1/admin/domains/"+url.PathEscape(domain)+"/history", nil); err != nil {
		return err
	}
	for _, v := range hist.Versions {
		what := ""
		if v.Deleted {
			what = " deleted"
		}
		if v.Note != "" {
			what += " (" + v.Note + ")"
		}
		fmt.Fprintf(w, "v%d\t%s\t%s%s\n", v.Version, v.Time.Format(time.RFC3339), v.Author, what)
		if diffs {
			fmt.Fprint(w, v.Diff)
		}
	}
	return nil
}

// domainDoc is one domain's document of a rules file.
type domainDoc struct {
	name   string // file, and document number when it has several
	domain string
	text   []byte
}

// docSeparator is a YAML document separator line.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?\r?\n`)

// domainDocs reads the rules file at path, checks it as serve would, and
// returns each of its domains' document text, split at --- lines.
func domainDocs(path string) ([]domainDoc, error) {
	if _, err := rules.Load(path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []domainDoc
	for i, part := range docSeparator.Split(string(data), -1) {
		name := fmt.Sprintf("%s (document %d)", path, i+1)
		s, err := rules.Parse(name, []byte(part))
		if err != nil {
			if strings.TrimSpace(part) == "" || strings.Contains(err.Error(), "the file is empty") {
				continue // an empty document
			}
			return nil, err
		}
		for _, d := range s.Domains() {
			out = append(out, domainDoc{name: name, domain: d, text: []byte(part)})
		}
	}
	return out, nil
}

// rulesImport pushes every domain of the rules files at path.
func rulesImport(ctx context.Context, ac *adminClient, path string, w io.Writer) error {
	files := []string{path}
	if fi, err := os.Stat(path); err != nil {
		return err
	} else if fi.IsDir() {
		if _, err := rules.Load(path); err != nil { // the whole directory as serve would read it
			return err
		}
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
	}
	for _, f := range files {
		docs, err := domainDocs(f)
		if err != nil {
			return err
		}
		for _, d := range docs {
			if err := pushDoc(ctx, ac, d, "", false, w); err != nil {
				return err
			}
		}
	}
	return nil
}
