//go:build linux

package docs_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestParseBlocks: markers are read from the line before a fence, and a
// marker's mistakes are reported with the file and line.
func TestParseBlocks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		md      string
		want    []marker // of each block, nil for none
		wantErr string
	}{
		{
			name: "run with want, needs and exit",
			md:   "text\n<!-- test: run; needs: nginx python3; want: 200   429; exit: 2 -->\n```sh\necho 200 429\n```\n",
			want: []marker{{mode: "run", needs: []string{"nginx", "python3"}, want: "200 429", exit: 2}},
		},
		{
			name: "parse, an unmarked json block, an indented yaml block",
			md:   "<!-- test: parse -->\n```sh\ndocker build .\n```\n```json\n{}\n```\n  <!-- test: rules -->\n  ```yaml\n  domain: api\n  ```\n",
			want: []marker{{mode: "parse"}, {}, {mode: "rules"}},
		},
		{
			name:    "unknown mode",
			md:      "<!-- test: execute -->\n```sh\ntrue\n```\n",
			wantErr: "x.md:1: marker \"execute\": mode \"execute\" is not run, parse, rules or identity",
		},
		{
			name:    "a marker away from its fence",
			md:      "<!-- test: run -->\n\n```sh\ntrue\n```\n",
			wantErr: "x.md:1: a test marker must be on the line right before a ``` fence",
		},
		{
			name:    "unknown key",
			md:      "<!-- test: run; wait: 5s -->\n```sh\ntrue\n```\n",
			wantErr: `unknown key "wait"`,
		},
		{
			name:    "want on a parsed block",
			md:      "<!-- test: parse; want: 429 -->\n```sh\ntrue\n```\n",
			wantErr: "needs, want and exit are for run blocks",
		},
		{
			name:    "an open fence",
			md:      "```sh\ntrue\n",
			wantErr: "x.md:1: ``` block not closed",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "x.md")
			if err := os.WriteFile(path, []byte(tc.md), 0o644); err != nil {
				t.Fatal(err)
			}
			blocks, err := parseBlocks(path, "x.md")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []marker
			for _, b := range blocks {
				if b.check == nil {
					got = append(got, marker{})
				} else {
					got = append(got, *b.check)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("markers %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCommands: a block is split into the simple commands the shell runs.
func TestCommands(t *testing.T) {
	t.Parallel()
	text := `go build -o sluice ./cmd/sluice
./sluice serve --rules examples/rules.yaml & # a comment; not a command
until curl -sf localhost:8080/readyz; do sleep 0.2; done
SLUICE_ADMIN_TOKEN=$secret sluice override set --limit 0/hour api "user=bob smith" \
    --for 1h
sluice check /dev/stdin <<'EOF'
domain: api
EOF
echo "$(date +%s) x" | grep -c x && kill %1
`
	want := [][]string{
		{"go", "build", "-o", "sluice", "./cmd/sluice"},
		{"./sluice", "serve", "--rules", "examples/rules.yaml"},
		{"until", "curl", "-sf", "localhost:8080/readyz"},
		{"do", "sleep", "0.2"},
		{"done"},
		{"SLUICE_ADMIN_TOKEN=$secret", "sluice", "override", "set", "--limit", "0/hour", "api", "user=bob smith", "--for", "1h"},
		{"sluice", "check", "/dev/stdin"},
		{"echo", "$(date +%s) x"},
		{"grep", "-c", "x"},
		{"kill", "%1"},
	}
	var got [][]string
	for _, c := range commands(text) {
		got = append(got, c.words)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("commands:\n%q\nwant\n%q", got, want)
	}
}

// TestCheckArgs: a sluice command line's subcommands and flags are checked
// against its help.
func TestCheckArgs(t *testing.T) {
	t.Parallel()
	r := &runner{help: map[string]*help{
		"":             {flags: map[string]bool{"help": true}, subs: map[string]bool{"serve": true, "rules": true}},
		"serve":        {flags: map[string]bool{"help": true, "rules": true, "store": true}, subs: map[string]bool{}},
		"rules":        {flags: map[string]bool{"help": true, "admin-url": true}, subs: map[string]bool{"import": true}},
		"rules import": {flags: map[string]bool{"help": true, "admin-url": true}, subs: map[string]bool{}},
	}}
	tests := []struct {
		line, wantErr string
	}{
		{line: "sluice serve --rules examples/rules.yaml --store=redis://x:6379", wantErr: ""},
		{line: "./sluice serve --rulez examples/rules.yaml", wantErr: "sluice serve has no flag --rulez"},
		{line: "go run ./cmd/sluice serve -store memory", wantErr: ""},
		{line: "sluice serv --rules x", wantErr: `sluice has no subcommand "serv"`},
		{line: "sluice rules import --admin-url http://x /etc/sluice/rules/", wantErr: ""},
		{line: "sluice rules export x", wantErr: `sluice rules has no subcommand "export"`},
		{line: "X=1 sluice rules import --admin-token s d", wantErr: "sluice rules import has no flag --admin-token"},
		{line: "sluice --rules x", wantErr: "sluice has no flag --rules"},
		{line: "sluice examples/rules.yaml", wantErr: `sluice has no subcommand "examples/rules.yaml"`},
	}
	for _, tc := range tests {
		cs := commands(tc.line)
		args, ok := sluiceArgs(cs[0].words)
		if !ok {
			t.Errorf("%s: not a sluice command", tc.line)
			continue
		}
		err := r.checkArgs(args)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.line, err)
		case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
			t.Errorf("%s: err = %v, want %q", tc.line, err, tc.wantErr)
		}
	}
	if _, ok := sluiceArgs([]string{"docker", "run", "sluice", "serve"}); ok {
		t.Error("docker run ... sluice is taken for a sluice command")
	}
}
