package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/simulate"
	"github.com/sluicehq/sluice/ui"
)

// maxTrafficLog is the largest recorded log `sluice simulate --traffic
// @FILE` reads: about a million lines of a timestamp and a short key.
const maxTrafficLog = 64 << 20

func simulateCommand(stdout io.Writer) *ff.Command {
	s := newSettings(forRules) // how rules are read
	var traffic, compare, out, format string
	fs := ff.NewFlagSet("simulate")
	fs.StringVar(&s.cfg.Rules.Source, 0, "rules", "", "rules file or directory whose limits are simulated (required)")
	s.register(fs, forRules)
	fs.StringVar(&traffic, 0, "traffic", "", "traffic pattern, such as \"steady 1/s 50s; burst 100; idle 1s; burst 100\" (phases: steady RATE DURATION, ramp FROM TO DURATION, burst N, idle DURATION, clients N), or @FILE: a recorded log of lines \"SECONDS [KEY]\" (required)")
	fs.StringVar(&compare, 0, "compare", "", "algorithms to play each limit's rate and period under as well, comma-separated, such as sliding_window,token_bucket")
	fs.StringVar(&out, 0, "out", "", "the report written (- for standard output); default simulate.html, or simulate.svg with --format svg")
	fs.StringVar(&format, 0, "format", "html", "the report's format: html (interactive charts, uPlot inline) or svg (a static image)")
	return &ff.Command{
		Name:      "simulate",
		Usage:     "sluice simulate --rules FILE --traffic SPEC|@LOG [--compare ALGORITHMS] [--format html|svg] [--out FILE]",
		ShortHelp: "play a traffic pattern against rules and plot what they admit",
		LongHelp: "Plays the traffic against every limit of the rules (and, with --compare, the same rate\n" +
			"and period under other algorithms), each client with its own state, with sluice's own\n" +
			"algorithms on a simulated clock that starts at midnight. Prints what each admitted and\n" +
			"denied and whether the traffic reached it (a request denied, or one that left nothing),\n" +
			"and writes an HTML report (uPlot inline, no network needed) or, with --format svg, a\n" +
			"static SVG image: a chart of each limit reached, admitted and denied stacked, on the\n" +
			"traffic's scale, a column a second (or more for a pattern over two minutes); the limits\n" +
			"not reached are listed. The dashboard's /ui/simulate does the same.",
		Flags: fs,
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usageError("simulate: unexpected arguments %q", args)
			}
			if s.cfg.Rules.Source == "" || traffic == "" {
				return usageError("simulate: --rules and --traffic are required")
			}
			if format != "html" && format != "svg" {
				return usageError("simulate: --format %q: want html or svg", format)
			}
			if out == "" {
				out = "simulate." + format
			}
			return runSimulate(s.cfg.Rules, traffic, compare, out, format, stdout)
		},
	}
}

func runSimulate(rc server.RulesConfig, traffic, compare, out, format string, stdout io.Writer) error {
	set, err := rc.Loader().Load(rc.Source)
	if err != nil {
		return fmt.Errorf("load rules: %w", err)
	}
	var pat simulate.Pattern
	if path, ok := strings.CutPrefix(traffic, "@"); ok {
		f, err := os.Open(path)
		if err != nil {
			return usageError("--traffic: %v", err)
		}
		defer f.Close()
		pat, err = simulate.ParseLog(io.LimitReader(f, maxTrafficLog))
		if err != nil {
			return usageError("--traffic %s: %v", path, err)
		}
	} else if pat, err = simulate.ParseTraffic(traffic); err != nil {
		return usageError("--traffic: %v", err)
	}
	var algs []string
	if compare != "" {
		algs = strings.Split(compare, ",")
	}
	res, err := ui.Run(set, pat, algs)
	if err != nil {
		return usageError("simulate: %v", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "limit\tadmitted\tdenied\tmost in a second\tmost in a period\treached\t\n")
	for _, s := range res.Series {
		var a, d int64
		for i := range s.Admitted {
			a, d = a+s.Admitted[i], d+s.Denied[i]
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t\n", s.Name, a, d, s.MaxAdmitted, s.MaxAdmittedWindow, map[bool]string{true: "yes", false: "no"}[s.Reached])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	write := ui.WriteReport
	if format == "svg" {
		write = simulate.WriteSVG
	}
	if out == "-" {
		return write(stdout, traffic, res)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".simulate-*."+format)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	err = write(tmp, traffic, res)
	if err == nil {
		err = tmp.Chmod(0o644) // a report to share, as any file written here; CreateTemp's is 0600
	}
	if err = errors.Join(err, tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("report %s: %w", out, err)
	}
	reached, _ := res.ReachedSeries()
	fmt.Fprintf(stdout, "report: %s (%d requests over %d s; a chart for each of the %d limits reached, of %d)\n",
		out, res.Requests, res.Seconds, len(reached), len(res.Series))
	return nil
}
