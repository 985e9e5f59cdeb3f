package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/peterbourgon/ff/v4"
)

func versionCommand(stdout io.Writer) *ff.Command {
	return &ff.Command{
		Name:      "version",
		Usage:     "sluice version",
		ShortHelp: "print the version",
		LongHelp: "Prints the module version sluice was built from: v1.2.3 for `go install ...@v1.2.3`, a\n" +
			"pseudo-version (v0.0.0-TIME-COMMIT) for `go build` in a git checkout, (devel) for `go run`\n" +
			"or a build with -buildvcs=false; then the commit and its time, +dirty with uncommitted\n" +
			"changes, when the build recorded them, and the Go version.",
		Flags: ff.NewFlagSet("version"),
		Exec: func(context.Context, []string) error {
			bi, _ := debug.ReadBuildInfo()
			fmt.Fprintln(stdout, versionString(version, bi))
			return nil
		},
	}
}

// version, when not empty, takes the place of the module version in the
// build information: go build -ldflags "-X main.version=v1.2.3" (the
// Dockerfile sets it).
var version = ""

// versionString returns "sluice VERSION [(commit REV[+dirty], TIME)] GOVERSION"
// from override, if not empty, else the main module's version in bi, and the
// version control settings in bi ("vcs.revision", "vcs.time",
// "vcs.modified"), which go build records in a checkout and go install
// from the module proxy does not. A nil bi (a binary built without module
// support) gives "(devel)" and an unknown Go version.
func versionString(override string, bi *debug.BuildInfo) string {
	v, gover := override, "unknown Go version"
	var rev, at string
	dirty := false
	if bi != nil {
		gover = bi.GoVersion
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	out := "sluice " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		out += " (commit " + rev
		if at != "" {
			out += ", " + at
		}
		out += ")"
	}
	return out + " " + gover
}
