package main

import (
	"runtime/debug"
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
		override string
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
			override: "v2.0.0",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
				Settings: vcs("vcs.revision", "abc", "vcs.time", "2026-11-23T13:00:00Z")},
			want: "sluice v2.0.0 (commit abc, 2026-11-23T13:00:00Z) go1.26.8",
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
