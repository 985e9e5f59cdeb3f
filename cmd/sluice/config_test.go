package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/rules"
)

// serveFlags returns the flags of `sluice serve`, --config included, parsed
// from args.
func serveFlags(t *testing.T, args ...string) ff.Flags {
	t.Helper()
	cmd := serveCommand(io.Discard)
	addConfigFlag([]*ff.Command{cmd})
	if err := cmd.Flags.Parse(args); err != nil {
		t.Fatal(err)
	}
	return cmd.Flags
}

func flagValue(t *testing.T, fs ff.Flags, name string) string {
	t.Helper()
	f, ok := fs.GetFlag(name)
	if !ok {
		t.Fatalf("no flag --%s", name)
	}
	return f.GetValue()
}

// TestConfigPrecedence checks that a flag wins over the environment, the
// environment over the file, and the file over the default.
func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "sluice.yaml", `# every layer sets some of these
grpc-addr: ":1001"
http-addr: ":2001"
store-timeout: 75ms
fail: closed
grpc-reflection: false
response-headers: [ratelimit, retry-after]
`)
	fs := serveFlags(t, "--config", file, "--grpc-addr", ":1000")
	getenv := env("SLUICE_GRPC_ADDR=:1002", "SLUICE_HTTP_ADDR=:2002", "SLUICE_FAIL=")
	if _, err := configure("serve", fs, getenv); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"grpc-addr":        ":1000",                 // flag over environment and file
		"http-addr":        ":2002",                 // environment over file
		"store-timeout":    "75ms",                  // file over default
		"fail":             "closed",                // an empty variable is unset
		"grpc-reflection":  "false",                 // a boolean
		"response-headers": "ratelimit,retry-after", // a list
		"store":            "memory",                // the default
	} {
		if got := flagValue(t, fs, name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
}

// TestConfigFromEnvironment checks that $SLUICE_CONFIG names the file.
func TestConfigFromEnvironment(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "sluice.yaml", "store-timeout: 5s\n")
	fs := serveFlags(t)
	if _, err := configure("serve", fs, env("SLUICE_CONFIG="+file)); err != nil {
		t.Fatal(err)
	}
	if got := flagValue(t, fs, "store-timeout"); got != "5s" {
		t.Errorf("--store-timeout = %q, want 5s", got)
	}
}

// TestConfigErrors checks that every mistake of a config file is reported
// with its file and line, also where a flag hides the value.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		args  []string
		wants []string // line: message, in order
	}{
		{name: "empty file", file: ""},
		{name: "only comments", file: "# nothing\n"},
		{name: "unknown key with a suggestion", file: "grpc-adr: :1\n", wants: []string{`1: grpc-adr: unknown setting (did you mean grpc-addr?)`}},
		{name: "unknown key", file: "\n\nflavour: vanilla\n", wants: []string{`3: flavour: unknown setting`}},
		{name: "short name is not a key", file: "h: x\n", wants: []string{`1: h: unknown setting`}},
		{name: "bad duration", file: "grpc-addr: :1\nstore-timeout: soon\n", wants: []string{`2: store-timeout: `}},
		{name: "bad boolean", file: "pprof: yes\n", wants: []string{`1: pprof: `}},
		{name: "bad int", file: "max-entries: many\n", wants: []string{`1: max-entries: `}},
		{name: "bad value hidden by a flag", file: "store-timeout: soon\n", args: []string{"--store-timeout", "1s"}, wants: []string{`1: store-timeout: `}},
		{name: "given twice", file: "fail: open\nfail: closed\n", wants: []string{`2: fail: given twice (first on line 1)`}},
		{name: "config in config", file: "config: other.yaml\n", wants: []string{`1: config: a config file cannot name another`}},
		{name: "no value", file: "store:\n", wants: []string{`1: store: no value`}},
		{name: "mapping value", file: "store:\n  url: redis://x\n", wants: []string{`2: store: want a value, got a mapping`}},
		{name: "nested list", file: "response-headers: [[a]]\n", wants: []string{`1: response-headers: want a list of values, got a list in it`}},
		{name: "comma in a list item", file: "response-headers: ['a,b']\n", wants: []string{`1: response-headers: list item "a,b" holds a comma`}},
		{name: "not a mapping", file: "- grpc-addr\n", wants: []string{`1: want a mapping of flag names to values, got a list`}},
		{name: "two documents", file: "fail: open\n---\nfail: closed\n", wants: []string{`2: more than one YAML document`}},
		{name: "syntax error", file: "fail: [open\n", wants: []string{`1: invalid YAML: `}},
		{name: "several mistakes", file: "nope: 1\nfail: open\nstore-timeout: x\n", wants: []string{`1: nope: unknown setting`, `3: store-timeout: `}},
		{name: "every value refused at its line, used or not", file: "fail: sometimes\nlog-level: loud\nlog-format: xml\notlp-protocol: pigeon\ntls-listeners: [grpc, nope]\n",
			wants: []string{`1: fail: unknown fail mode "sometimes"`, `2: log-level: unknown log level "loud"`, `3: log-format: unknown log format "xml"`,
				`4: otlp-protocol: unknown OTLP protocol "pigeon"`, `5: tls-listeners: unknown listener "nope"`}},
		{name: "indentation mistake at its line", file: "response-headers:\n  - ratelimit\n  - retry-after\n fail: open\n", wants: []string{`4: invalid YAML: did not find expected key`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeTemp(t, "sluice.yaml", tt.file)
			fs := serveFlags(t, append([]string{"--config", path}, tt.args...)...)
			_, err := configure("serve", fs, env())
			if len(tt.wants) == 0 {
				if err != nil {
					t.Fatalf("configure: %v", err)
				}
				return
			}
			if exitCode(err) != 2 {
				t.Fatalf("exit code %d (%v), want 2", exitCode(err), err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.wants) {
				t.Fatalf("%d mistakes, want %d:\n%v", len(lines), len(tt.wants), err)
			}
			for i, want := range tt.wants {
				if !strings.HasPrefix(lines[i], path+":"+want) {
					t.Errorf("mistake %d = %q, want %s:%s...", i, lines[i], path, want)
				}
			}
		})
	}
}

// TestConfigFileErrorsAreTyped checks that applyConfig's mistakes are the
// rules package's file:line errors.
func TestConfigFileErrorsAreTyped(t *testing.T) {
	t.Parallel()
	err := applyConfig(serveFlags(t), "f.yaml", []byte("nope: 1\n"))
	var e *rules.Error
	if !errors.As(err, &e) || e.File != "f.yaml" || e.Line != 1 {
		t.Fatalf("applyConfig = %#v, want a *rules.Error at f.yaml:1", err)
	}
}

func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	big := writeTemp(t, "big.yaml", "# "+strings.Repeat("x", maxConfigBytes)+"\n")
	for name, path := range map[string]string{
		"too large": big,
		"missing":   filepath.Join(t.TempDir(), "nope.yaml"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := configure("serve", serveFlags(t, "--config", path), env()); exitCode(err) != 2 {
				t.Fatalf("configure = %v, want exit code 2", err)
			}
		})
	}
}

// TestServeConfigFile runs serve with its rules and fail mode from a
// config file.
func TestServeConfigFile(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "sluice.yaml", "rules: "+exampleRules+"\nfail: closed\n")
	s := startServer(t, nil, "--config", file)
	rec := s.logs.Find("listening")
	if rec["fail"] != "closed" {
		t.Errorf("listening with fail %v, want closed (from the file)", rec["fail"])
	}
	if r := s.do(t, "GET", "/readyz", ""); r.code != 200 {
		t.Errorf("/readyz = %d %s", r.code, r.body)
	}
}

func FuzzConfig(f *testing.F) {
	for _, s := range []string{"", "grpc-addr: :1\n", "response-headers: [a, b]\n", "a: &x 1\nb: *x\n", "- 1\n", "fail: [open\n", "{store-timeout: 1s, pprof: true}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd := serveCommand(io.Discard)
		addConfigFlag([]*ff.Command{cmd})
		if err := cmd.Flags.Parse(nil); err != nil {
			t.Fatal(err)
		}
		err := applyConfig(cmd.Flags, "f.yaml", data)
		if err == nil {
			return
		}
		var es rules.Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Fatalf("applyConfig = %v, want rules.Errors", err)
		}
	})
}

// TestReadmeConfig checks that docs/configuration.md's config file example is one.
func TestReadmeConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n# sluice.yaml")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/configuration.md has no ```yaml block starting with # sluice.yaml")
	}
	fs := serveFlags(t)
	if err := applyConfig(fs, "docs/configuration.md", []byte("#"+block)); err != nil {
		t.Fatal(err)
	}
	if got := flagValue(t, fs, "fail"); got != "local" {
		t.Errorf("--fail = %q, want local", got)
	}
}
