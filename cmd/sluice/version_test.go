package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionString(t *testing.T) {
	t.Parallel()
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	tests := []struct {
		name     string
		override stamp
		bi       *debug.BuildInfo
		want     string
	}{
		{name: "no build info", want: "sluice (devel) unknown Go version"},
		{
			name: "go install from the proxy",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v1.4.0"}},
			want: "sluice v1.4.0 go1.26.8",
		},
		{
			name: "build in a checkout",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
				Settings: vcs("vcs", "git", "vcs.revision", "d3586cb0123456789abcdef0123456789abcdef0", "vcs.time", "2026-11-23T13:00:00Z", "vcs.modified", "false")},
			want: "sluice (devel) (commit d3586cb01234, 2026-11-23T13:00:00Z) go1.26.8",
		},
		{
			name: "modified checkout",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
				Settings: vcs("vcs.revision", "d3586cb0123456789abcdef", "vcs.modified", "true")},
			want: "sluice (devel) (commit d3586cb01234+dirty) go1.26.8",
		},
		{
			name:     "ldflags override",
			override: stamp{version: "v2.0.0"},
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
				Settings: vcs("vcs.revision", "abc", "vcs.time", "2026-11-23T13:00:00Z")},
			want: "sluice v2.0.0 (commit abc, 2026-11-23T13:00:00Z) go1.26.8",
		},
		{
			name:     "release stamp",
			override: stamp{"v0.1.0", "5907ab3abcdef0123456789abcdef0123456789a", "2026-11-28T19:00:00Z"},
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
				Settings: vcs("vcs.revision", "abc", "vcs.modified", "true")},
			want: "sluice v0.1.0 (commit 5907ab3abcde, 2026-11-28T19:00:00Z) go1.26.8",
		},
		{
			name: "pseudo-version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261123130000-d3586cb01234"}},
			want: "sluice v0.0.0-20261123130000-d3586cb01234 go1.26.8",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := versionString(tt.override, tt.bi); got != tt.want {
				t.Errorf("versionString = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestVersionHelp: the help says what a build in a checkout prints, as
// docs/deploy.md does: a pseudo-version with its commit (it said
// "(devel) for a build in a checkout", which is go run's).
func TestVersionHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version", "--help"}, env(), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	h := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"pseudo-version (v0.0.0-TIME-COMMIT) for `go build` in a git checkout", "(devel) for `go run`", "-buildvcs=false", "+dirty"} {
		if !strings.Contains(h, want) {
			t.Errorf("version --help lacks %q:\n%s", want, out.String())
		}
	}
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	if d := strings.Join(strings.Fields(string(doc)), " "); !strings.Contains(d, "a pseudo-version with the commit and its time for `go build` in a checkout") {
		t.Errorf("docs/deploy.md no longer says what a build in a checkout prints: keep it and version --help agreeing")
	}
}
