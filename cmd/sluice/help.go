package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/peterbourgon/ff/v4"
)

// helpWidth is the widest line of sluice's help: every text is wrapped to
// it (a test checks each command's).
const helpWidth = 100

// flagGroups are the headings the flags of settingsTable are listed under,
// in the order of the help; a flag of no group is listed first, under
// FLAGS.
var flagGroups = []struct{ name, title string }{
	{"listeners", "LISTENERS"},
	{"rules", "RULES"},
	{"store", "STORE"},
	{"sync", "SYNC MODES (how limits reach Redis: --sync, or a rule's sync:)"},
	{"decisions", "DECISIONS"},
	{"admin", "ADMIN API"},
	{"tls", "TLS"},
	{"observability", "OBSERVABILITY"},
	{"envoy", "ENVOY RATELIMIT COMPATIBILITY (Envoy's variables set these too)"},
}

// example is a command line shown at the top of a command's help, and what
// it does.
type example struct{ line, what string }

// examples are the examples of each command, by its path below sluice
// ("" for sluice itself, "rules push").
var examples = map[string][]example{
	"": {
		{"sluice serve --rules examples/rules.yaml", "serve the example rules: gRPC on 127.0.0.1:8081, HTTP on 127.0.0.1:8080"},
		{"sluice check examples/rules.yaml", "check a rules file as serve reads it, each mistake at its file:line"},
		{"sluice help serve", "serve's flags, by group"},
	},
	"serve": {
		{"sluice serve --rules examples/rules.yaml", "one node, counters in memory: gRPC on 127.0.0.1:8081, HTTP on 127.0.0.1:8080"},
		{"sluice serve --rules rules/ --store redis://redis:6379 --grpc-addr :8081 --http-addr :8080",
			"one of many nodes sharing one Redis, every limit exact, listening on all interfaces"},
		{"REDIS_URL=redis:6379 RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit sluice serve",
			"in place of Envoy's ratelimit, from its variables, runtime directory and Redis keys"},
	},
	"proxy": {
		{"sluice proxy --upstream http://127.0.0.1:9000 --rules examples/rules.yaml --domain api",
			"one limit per client IP (the rules' remote_address) in front of a service on port 9000"},
		{"sluice proxy --upstream http://app:9000 --rules rules.yaml --identity identity.yaml --listen :8000",
			"descriptors from headers, JWT claims and paths, as the identity file says"},
	},
	"check": {
		{"sluice check examples/rules.yaml", "the rules as serve reads them: each mistake as file:line: message"},
		{"sluice check --store redis://localhost:6379 --identity identity.yaml rules/",
			"a rules directory for a Redis store, and the identity file that feeds it"},
	},
	"bench": {
		{"sluice bench --grpc-addr 127.0.0.1:8081 --duration 10s", "10,000 users at random: the example rules' 30 a second each never bite"},
		{"sluice bench --grpc-addr 127.0.0.1:8081 --users 10", "ten users: each far over the example rules' limit, most calls OVER_LIMIT"},
		{"sluice bench --http-url http://127.0.0.1:8080 --zipf 1.2", "users drawn skewed: the busiest over their limits, the rest not"},
	},
	"simulate": {
		{"sluice simulate --rules examples/rules.yaml --traffic 'clients 10; steady 10/s 60s'",
			"ten clients at 1 a second each for a minute against every limit of the rules"},
		{"sluice simulate --rules rules.yaml --traffic 'idle 59s; burst 100; idle 1s; burst 100' --compare sliding_window",
			"a fixed window's boundary burst beside a sliding window's"},
	},
	"help": {
		{"sluice help serve", "serve's examples and flags"},
		{"sluice help rules push", "a subcommand's"},
	},
}

// groupOf returns the group of the flag called name in settingsTable, or
// "" for a flag not in it.
func groupOf(name string) string {
	for _, st := range settingsTable {
		if st.name == name {
			return st.group
		}
	}
	return ""
}

// commandPath returns the names of the commands from root down to cmd,
// root's first, or nil when cmd is not in root's tree.
func commandPath(root, cmd *ff.Command) []string {
	if root == cmd {
		return []string{root.Name}
	}
	for _, sub := range root.Subcommands {
		if p := commandPath(sub, cmd); p != nil {
			return append([]string{root.Name}, p...)
		}
	}
	return nil
}

// findCommand returns the command of root that names walks down to, and
// how many of names it took.
func findCommand(root *ff.Command, names []string) (*ff.Command, int) {
	cmd, n := root, 0
	for _, name := range names {
		i := slices.IndexFunc(cmd.Subcommands, func(c *ff.Command) bool { return strings.EqualFold(c.Name, name) })
		if i < 0 {
			break
		}
		cmd, n = cmd.Subcommands[i], n+1
	}
	return cmd, n
}

// commandHelp returns the help of cmd, a command of root's tree: what it
// does, its usage, examples, its long help, its subcommands and its flags
// by group, every line at most helpWidth wide.
func commandHelp(root, cmd *ff.Command) string {
	path := commandPath(root, cmd)
	var b strings.Builder
	section := func(title string) { fmt.Fprintf(&b, "\n%s\n", title) }
	wrapTo(&b, strings.Join(path, " ")+": "+cmd.ShortHelp, "", "  ")
	if cmd.Usage != "" {
		section("USAGE")
		for _, u := range strings.Split(cmd.Usage, "\n") {
			wrapTo(&b, u, "  ", "      ")
		}
	}
	if exs := examples[strings.Join(path[1:], " ")]; len(exs) > 0 {
		section("EXAMPLES")
		for _, e := range exs {
			wrapTo(&b, e.line, "  ", "      ")
			wrapTo(&b, e.what, "      ", "      ")
		}
	}
	if cmd.LongHelp != "" {
		b.WriteString("\n")
		for i, p := range paragraphs(cmd.LongHelp) {
			if i > 0 {
				b.WriteString("\n")
			}
			wrapTo(&b, p, "", "")
		}
	}
	if len(cmd.Subcommands) > 0 {
		section("SUBCOMMANDS")
		w := 0
		for _, s := range cmd.Subcommands {
			w = max(w, len(s.Name))
		}
		for _, s := range cmd.Subcommands {
			wrapTo(&b, s.ShortHelp, fmt.Sprintf("  %-*s  ", w, s.Name), strings.Repeat(" ", w+4))
		}
		fmt.Fprintf(&b, "\nRun `%s help COMMAND` (or `%s COMMAND --help`) for a command's flags.\n",
			path[0], strings.Join(path, " "))
	}
	writeFlags(&b, root, cmd)
	return strings.TrimRight(b.String(), "\n")
}

// writeFlags writes cmd's flags: its own by group, then those of the
// commands above it that it takes too.
func writeFlags(b *strings.Builder, root, cmd *ff.Command) {
	if cmd.Flags == nil {
		return
	}
	own := map[string][]ff.Flag{}
	var inherited []ff.Flag
	_ = cmd.Flags.WalkFlags(func(f ff.Flag) error {
		if f.GetFlags() != cmd.Flags {
			inherited = append(inherited, f)
			return nil
		}
		name, _ := f.GetLongName()
		own[groupOf(name)] = append(own[groupOf(name)], f)
		return nil
	})
	write := func(title string, fs []ff.Flag) {
		if len(fs) == 0 {
			return
		}
		fmt.Fprintf(b, "\n%s\n", title)
		for _, f := range fs {
			writeFlag(b, f)
		}
	}
	write("FLAGS", own[""])
	for _, g := range flagGroups {
		write(g.title, own[g.name])
	}
	if len(inherited) > 0 {
		parent := "the command above"
		if p := parentOf(root, cmd); p != nil {
			parent = strings.Join(commandPath(root, p), " ")
		}
		write("FLAGS OF "+strings.ToUpper(parent)+" (every one of its commands)", inherited)
	}
}

// parentOf returns the command whose subcommand cmd is, or nil.
func parentOf(root, cmd *ff.Command) *ff.Command {
	for _, s := range root.Subcommands {
		if s == cmd {
			return root
		}
		if p := parentOf(s, cmd); p != nil {
			return p
		}
	}
	return nil
}

// writeFlag writes one flag: its name, value and default on a line, its
// usage wrapped below.
func writeFlag(b *strings.Builder, f ff.Flag) {
	name, _ := f.GetLongName()
	line := "--" + name
	if p := f.GetPlaceholder(); p != "" {
		line += " " + p
	}
	if d := f.GetDefault(); d != "" && !(d == "false" && f.GetPlaceholder() == "") {
		line += "   (default " + d + ")"
	}
	wrapTo(b, line, "  ", "      ")
	wrapTo(b, f.GetUsage(), "      ", "      ")
}

// paragraphs splits text at blank lines and joins each paragraph's lines
// with spaces, but for a line that starts with a space, which stays a line
// of its own.
func paragraphs(text string) []string {
	var out []string
	for _, p := range strings.Split(strings.TrimSpace(text), "\n\n") {
		var lines []string
		for _, l := range strings.Split(p, "\n") {
			if len(lines) > 0 && !strings.HasPrefix(l, " ") && !strings.HasSuffix(lines[len(lines)-1], "\n") {
				lines[len(lines)-1] += " " + strings.TrimSpace(l)
				continue
			}
			if strings.HasPrefix(l, " ") {
				if len(lines) > 0 {
					lines[len(lines)-1] += "\n"
				}
				lines = append(lines, l+"\n")
				continue
			}
			lines = append(lines, l)
		}
		out = append(out, strings.TrimRight(strings.Join(lines, ""), "\n"))
	}
	return out
}

// wrapTo writes text wrapped to helpWidth: its first line after first, the
// others after rest (indentations). Each line of text (split at "\n") is
// wrapped on its own; a word longer than a line is left whole.
func wrapTo(b *strings.Builder, text, first, rest string) {
	for i, l := range strings.Split(text, "\n") {
		indent := first
		if i > 0 {
			indent = rest
		}
		line, empty := indent, true
		for _, w := range strings.Fields(l) {
			if !empty && len(line)+1+len(w) > helpWidth {
				b.WriteString(line + "\n")
				line, empty = rest, true
			}
			if !empty {
				line += " "
			}
			line += w
			empty = false
		}
		b.WriteString(line + "\n")
	}
}

// helpCommand is `sluice help [COMMAND...]`: the help of sluice or of a
// command, on stdout.
func helpCommand(root func() *ff.Command, stdout io.Writer) *ff.Command {
	return &ff.Command{
		Name:      "help",
		Usage:     "sluice help [COMMAND [SUBCOMMAND]]",
		ShortHelp: "print a command's help: its examples and flags",
		Flags:     ff.NewFlagSet("help"),
		Exec: func(_ context.Context, args []string) error {
			r := root()
			cmd, n := findCommand(r, args)
			if n < len(args) {
				return unknownCommand(r, cmd, args[n])
			}
			fmt.Fprintln(stdout, commandHelp(r, cmd))
			return nil
		},
	}
}

// unknownCommand is the usage error for name, which is no subcommand of
// cmd: the closest name if one is near, and where to find the others.
func unknownCommand(root, cmd *ff.Command, name string) error {
	path := strings.Join(commandPath(root, cmd), " ")
	var names []string
	for _, s := range cmd.Subcommands {
		names = append(names, s.Name)
	}
	msg := fmt.Sprintf("%sunknown command %q", below(root, cmd), name)
	if best := closest(name, names); best != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", best)
	}
	return usageError("%s\nThe commands are %s: run `%s --help` for what each does.", msg, strings.Join(names, ", "), path)
}

// closest returns the name of names nearest to s, at most two edits away
// (or one for a short s), or "" when none is; a name s is a prefix of
// counts as near.
func closest(s string, names []string) string {
	best, bestD := "", min(3, len(s))
	for _, n := range names {
		d := editDistance(strings.ToLower(s), n)
		if len(s) >= 3 && strings.HasPrefix(n, strings.ToLower(s)) {
			d = 1
		}
		if d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// unknownFlagRE finds the name in ff's unknown flag error.
var unknownFlagRE = regexp.MustCompile(`unknown flag "([^"]*)"`)

// parseError turns an error of parsing cmd's command line (args) into the
// usage error sluice reports: what was wrong first, the nearest flag for
// one unknown, and where the flags are listed; never the whole help.
func parseError(root, cmd *ff.Command, args []string, err error) error {
	path := strings.Join(commandPath(root, cmd), " ")
	msg := err.Error()
	msg = strings.TrimPrefix(msg, cmd.Name+": ")
	msg = strings.TrimPrefix(msg, "parse args: ")
	msg = setRE.ReplaceAllString(msg, "$1: ")
	switch m := unknownFlagRE.FindStringSubmatch(msg); {
	case m != nil:
		dash := "--"
		if len([]rune(m[1])) == 1 {
			dash = "-"
		}
		msg = "unknown flag " + dash + m[1]
		if s := suggest(cmd.Flags, m[1]); s != "" {
			msg += strings.Replace(s, "mean ", "mean --", 1)
		}
	case msg == "missing value" && len(args) > 0:
		msg = args[len(args)-1] + ": missing value"
	}
	return usageError("%s%s\nRun `%s --help` for its flags.", below(root, cmd), msg, path)
}

// setRE finds what ff adds to a flag's error: the value, which the flag's
// own error names.
var setRE = regexp.MustCompile(`^(--[\w-]+): set "(?:[^"\\]|\\.)*": `)

// below returns cmd's path under sluice followed by ": " ("rules push: "),
// or "" for sluice itself: what an error message starts with, after the
// "sluice: " main writes.
func below(root, cmd *ff.Command) string {
	p := commandPath(root, cmd)
	if len(p) <= 1 {
		return ""
	}
	return strings.Join(p[1:], " ") + ": "
}
