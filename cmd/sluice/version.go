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
			"changes, when the build recorded them, and the Go version. A release (scripts/release.sh)\n" +
			"has its version, commit and date stamped in.",
		Flags: ff.NewFlagSet("version"),
		Exec: func(context.Context, []string) error {
			bi, _ := debug.ReadBuildInfo()
			fmt.Fprintln(stdout, versionString(stamp{version, commit, date}, bi))
			return nil
		},
	}
}

// version, commit and date, when not empty, take the place of the module
// version and of the commit and its time in the build information:
// scripts/release.sh stamps all three (go build -ldflags "-X
// main.version=v1.2.3 -X main.commit=SHA -X main.date=2026-11-28T20:00:00Z"),
// building from an export of the commit without version control
// information; the Dockerfile and deploy/image/build.sh set the version.
var version, commit, date = "", "", ""

// stamp is what the linker set: version, commit and date above.
type stamp struct{ version, commit, date string }

// versionString returns "sluice VERSION [(commit REV[+dirty], TIME)] GOVERSION"
// from the stamp's fields where they are not empty, else from bi: the main
// module's version and the version control settings ("vcs.revision",
// "vcs.time", "vcs.modified"), which go build records in a checkout and go
// install from the module proxy does not. A stamped commit is never
// dirty: the release builds a commit's files. A nil bi (a binary built
// without module support) gives "(devel)" and an unknown Go version.
func versionString(st stamp, bi *debug.BuildInfo) string {
	v, gover := st.version, "unknown Go version"
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
	if st.commit != "" {
		rev, at, dirty = st.commit, st.date, false
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
