package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/internal/loadgen"
)

// allCommands returns the path of every command of sluice below it
// ("serve", "rules push"), parents before their subcommands.
func allCommands(t *testing.T) [][]string {
	t.Helper()
	root := newRoot(env(), io.Discard, io.Discard)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, env(), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var paths [][]string
	var walk func(c *ff.Command, path []string)
	walk = func(c *ff.Command, path []string) {
		for _, s := range c.Subcommands {
			p := append(append([]string(nil), path...), s.Name)
			paths = append(paths, p)
			walk(s, p)
		}
	}
	walk(root, nil)
	for _, name := range []string{"serve", "proxy", "check", "bench", "simulate", "version", "rules", "override", "help"} {
		if !strings.Contains(out.String(), "\n  "+name+" ") {
			t.Errorf("sluice --help does not list %s:\n%s", name, out.String())
		}
	}
	return paths
}

// help runs sluice with args and returns its stdout, failing on an error.
func help(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), args, env(), &out, &errOut); err != nil {
		t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

// TestHelpWidth: no line of any command's help is wider than 100
// characters (serve's had 64 over it, twelve over 200), and `sluice help
// CMD` prints what `sluice CMD --help` does.
func TestHelpWidth(t *testing.T) {
	t.Parallel()
	for _, path := range append([][]string{nil}, allCommands(t)...) {
		name := strings.Join(append([]string{"sluice"}, path...), " ")
		h := help(t, append(append([]string(nil), path...), "--help")...)
		for i, line := range strings.Split(h, "\n") {
			if n := len([]rune(line)); n > helpWidth {
				t.Errorf("%s --help, line %d: %d characters:\n%s", name, i+1, n, line)
			}
		}
		if via := help(t, append([]string{"help"}, path...)...); via != h {
			t.Errorf("sluice help %s differs from %s --help:\n%s\n---\n%s", strings.Join(path, " "), name, via, h)
		}
	}
}

// TestServeHelp: serve's help starts with three examples and lists its
// flags under their groups, in order, each flag once.
func TestServeHelp(t *testing.T) {
	t.Parallel()
	h := help(t, "serve", "--help")
	ex := strings.Index(h, "\nEXAMPLES\n")
	flags := strings.Index(h, "\nFLAGS\n")
	if ex < 0 || flags < 0 || ex > flags || ex > strings.Index(h, "Serves envoy.service") {
		t.Fatalf("serve --help: want EXAMPLES before the text and the flags:\n%s", h)
	}
	if n := len(regexp.MustCompile(`(?m)^  (sluice|\S+=\S+ .*sluice) serve`).FindAllString(h[ex:flags], -1)); n != 3 {
		t.Errorf("serve --help has %d examples, want 3:\n%s", n, h[ex:flags])
	}
	at := flags
	for _, g := range flagGroups {
		i := strings.Index(h, "\n"+g.title+"\n")
		if i < at {
			t.Errorf("serve --help: group %q missing or out of order", g.title)
			continue
		}
		at = i
	}
	for _, want := range []struct{ group, flag string }{
		{"LISTENERS", "--grpc-addr"}, {"RULES", "--rules"}, {"STORE", "--store"}, {"SYNC MODES", "--sync"},
		{"ADMIN API", "--admin-tokens"}, {"TLS", "--tls-cert"}, {"OBSERVABILITY", "--otlp-endpoint"},
		{"ENVOY RATELIMIT COMPATIBILITY", "--envoy-redis-keys"}, {"ENVOY RATELIMIT COMPATIBILITY", "--rules-envoy-layout"},
	} {
		g := strings.Index(h, "\n"+want.group)
		f := strings.Index(h, "\n  "+want.flag+" ")
		if f < 0 {
			f = strings.Index(h, "\n  "+want.flag+"\n")
		}
		end := strings.Index(h[g+1:], "\n\n")
		if end < 0 {
			end = len(h)
		}
		if g < 0 || f < g || f > g+1+end {
			t.Errorf("serve --help: %s is not under %s", want.flag, want.group)
		}
	}
	for _, st := range settingsTable {
		if st.cmds&forServe != 0 && strings.Count(h, "\n  --"+st.name+" ")+strings.Count(h, "\n  --"+st.name+"\n") != 1 {
			t.Errorf("serve --help lists --%s other than once", st.name)
		}
	}
}

// TestUsageErrors: a mistake on the command line is reported first, in a
// line or two, with the nearest name for a misspelling, never above the
// whole help; exit status 2.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string // the first line of the error
	}{
		{[]string{"serv"}, `unknown command "serv" (did you mean serve?)`},
		{[]string{"chek", "x.yaml"}, `unknown command "chek" (did you mean check?)`},
		{[]string{"rules", "pussh", "f.yaml"}, `rules: unknown command "pussh" (did you mean push?)`},
		{[]string{"help", "simulat"}, `unknown command "simulat" (did you mean simulate?)`},
		{[]string{"help", "rules", "hist"}, `rules: unknown command "hist" (did you mean history?)`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"serve", "--rule", "x.yaml"}, "serve: unknown flag --rule (did you mean --rules?)"},
		{[]string{"serve", "--bogus"}, "serve: unknown flag --bogus"},
		{[]string{"serve", "--fail", "sideways"}, `serve: --fail: unknown fail mode "sideways" (want local, open or closed)`},
		{[]string{"serve", "--rules-poll"}, "serve: --rules-poll: missing value"},
		{[]string{"override", "set", "--limt", "5/s"}, "override set: unknown flag --limt (did you mean --limit?)"},
		{[]string{"rules"}, "rules: want a command: run `sluice rules --help` for them"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, env(), &out, &errOut)
		if exitCode(err) != 2 {
			t.Errorf("sluice %s: %v, want exit status 2", strings.Join(tc.args, " "), err)
			continue
		}
		msg := strings.Split(err.Error(), "\n")
		if msg[0] != tc.want || len(msg) > 2 || errOut.Len() > 0 || out.Len() > 0 {
			t.Errorf("sluice %s: error %q (stdout %d, stderr %d bytes), want first %q and nothing else",
				strings.Join(tc.args, " "), err.Error(), out.Len(), errOut.Len(), tc.want)
		}
	}
	// No command: the error first, then the commands.
	var errOut bytes.Buffer
	err := run(context.Background(), nil, env(), io.Discard, &errOut)
	if exitCode(err) != 2 || !strings.HasPrefix(errOut.String(), "sluice: no command given\n") || !strings.Contains(errOut.String(), "SUBCOMMANDS") {
		t.Errorf("sluice alone: %v\n%s", err, errOut.String())
	}
}

// TestBenchHint: sluice bench says how to make it hit limits, in its help
// and when no call was over one.
func TestBenchHint(t *testing.T) {
	t.Parallel()
	if h := help(t, "bench", "--help"); !strings.Contains(h, "To make it hit limits, load fewer users (--users 10") || !strings.Contains(h, "--zipf 1.2") {
		t.Errorf("bench --help does not say how to hit limits:\n%s", h)
	}
	c := loadgen.DefaultConfig()
	c.GRPCAddr = "127.0.0.1:8081"
	var out bytes.Buffer
	printBench(&out, c, &loadgen.Result{OK: 1000, Elapsed: time.Second})
	if !strings.Contains(out.String(), "none over a limit") || !strings.Contains(out.String(), "--users 10") {
		t.Errorf("a run without OVER_LIMIT:\n%s", out.String())
	}
	out.Reset()
	printBench(&out, c, &loadgen.Result{OK: 1000, Over: 5, Elapsed: time.Second})
	if strings.Contains(out.String(), "none over a limit") {
		t.Errorf("a run with OVER_LIMIT:\n%s", out.String())
	}
}

// TestBenchFailModes: sluice bench says how many answers the server's fail
// mode made (it said "OK 79050, errors 0" while the breaker was open), and
// does not blame the spread of users for no OVER_LIMIT then.
func TestBenchFailModes(t *testing.T) {
	t.Parallel()
	c := loadgen.DefaultConfig()
	c.GRPCAddr = "127.0.0.1:8081"
	var out bytes.Buffer
	printBench(&out, c, &loadgen.Result{OK: 79050, Modes: map[string]int{"fail_open": 79000, "slow": 50}, Elapsed: time.Second})
	if want := "fail mode:   79050 of them not decided by the store (fail_open 79000, slow 50)"; !strings.Contains(out.String(), want) || strings.Contains(out.String(), "none over a limit") {
		t.Errorf("a run in fail open:\n%s\nwant %q, and no hint about users", out.String(), want)
	}
	out.Reset()
	printBench(&out, c, &loadgen.Result{OK: 1000, Over: 5, Modes: map[string]int{}, Elapsed: time.Second})
	if strings.Contains(out.String(), "fail mode") {
		t.Errorf("a run on the store:\n%s", out.String())
	}
}
