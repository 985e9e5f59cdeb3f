package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSimulateCommand: sluice simulate prints what each limit admitted and
// writes a self-contained report.
func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	writeFile(t, rulesPath, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	logPath := filepath.Join(dir, "traffic.log")
	writeFile(t, logPath, "# seconds key\n59.5 alice\n59.6 alice\n60.1 alice\n")
	out := filepath.Join(dir, "report.html")
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"simulate", "--rules", rulesPath, "--traffic", "idle 59s; burst 100; idle 1s; burst 100",
		"--compare", "sliding_window", "--out", out}, env(), &stdout, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`api.user 100/1m0s\s+200\s+0\s+100\s+200`, `api.user 100/1m0s sliding_window\s+100\s+100\s+100\s+100`, `report: .*report.html \(200 requests over 61 s; a chart for each of the 2 limits reached, of 2\)`} {
		if !regexp.MustCompile(want).MatchString(stdout.String()) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	html, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), "uPlot") || strings.Contains(string(html), "<script src") || !strings.Contains(string(html), `"max_admitted_window":200`) {
		t.Errorf("report is not self-contained or lacks the data (%d bytes)", len(html))
	}

	// The example rules: a chart for each limit the traffic reached, not
	// one for each of their 19 (issue 24.4).
	stdout.Reset()
	if err := run(context.Background(), []string{"simulate", "--rules", "../../examples/rules.yaml", "--traffic", "clients 10; steady 10/s 60s",
		"--compare", "sliding_window", "--out", out}, env(), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := `api.api_key 10000/24h0m0s\s+600\s+0\s+10\s+600\s+no\n(.|\n)*a chart for each of the 6 limits reached, of 19\)`; !regexp.MustCompile(want).MatchString(stdout.String()) {
		t.Errorf("the example rules: output lacks %q:\n%s", want, stdout.String())
	}

	stdout.Reset()
	if err := run(context.Background(), []string{"simulate", "--rules", rulesPath, "--traffic", "@" + logPath, "--out", "-"}, env(), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "<!doctype html>") || !regexp.MustCompile(`100/1m0s\s+3\s+0`).MatchString(stdout.String()) {
		t.Errorf("recorded log to stdout:\n%.300s", stdout.String())
	}

	// --format svg: a static image, simulate.svg in the working directory
	// unless --out names another file.
	svgPath := filepath.Join(dir, "report.svg")
	stdout.Reset()
	if err := run(context.Background(), []string{"simulate", "--rules", rulesPath, "--traffic", "idle 59s; burst 100; idle 1s; burst 100",
		"--format", "svg", "--out", svgPath}, env(), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName xml.Name `xml:"http://www.w3.org/2000/svg svg"`
		Groups  []struct {
			Limit    string `xml:"data-limit,attr"`
			Admitted int64  `xml:"data-admitted,attr"`
		} `xml:"g"`
	}
	if err := xml.Unmarshal(svg, &doc); err != nil || len(doc.Groups) != 1 || doc.Groups[0].Limit != "100/1m0s" || doc.Groups[0].Admitted != 200 {
		t.Errorf("SVG report: %+v, %v; want one panel of 100/1m0s with 200 admitted", doc, err)
	}
	if !strings.Contains(stdout.String(), "report: "+svgPath) {
		t.Errorf("output %q lacks the report's path", stdout.String())
	}

	for _, args := range [][]string{
		{"simulate", "--rules", rulesPath, "--traffic", "burst 1", "--format", "png"},
		{"simulate", "--rules", rulesPath},
		{"simulate", "--rules", rulesPath, "--traffic", "warp 9"},
		{"simulate", "--rules", rulesPath, "--traffic", "burst 1", "--compare", "fastest"},
		{"simulate", "--rules", rulesPath, "--traffic", "@" + filepath.Join(dir, "missing")},
	} {
		var ee *exitError
		if err := run(context.Background(), args, env(), io.Discard, io.Discard); !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// TestSimulateReportMode: the report is a file to share, readable by
// others as any file a command writes (0644), not 0600 as the temporary
// file it is written to (issue 35).
func TestSimulateReportMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	writeFile(t, rulesPath, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	for _, format := range []string{"html", "svg"} {
		out := filepath.Join(dir, "report."+format)
		if err := run(context.Background(), []string{"simulate", "--rules", rulesPath, "--traffic", "burst 10",
			"--format", format, "--out", out}, env(), io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o644 {
			t.Errorf("%s report: mode %v, want -rw-r--r--", format, got)
		}
	}
}
