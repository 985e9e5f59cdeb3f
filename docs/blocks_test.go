//go:build linux

// Package docs_test checks the documentation as a reader uses it: every
// shell block of README.md and docs/*.md carries a marker that says how it
// is checked, and the test runs or parses it accordingly, so that a block
// that no longer works as pasted fails CI. A marker is an HTML comment on the
// line before the block's fence, invisible on GitHub:
//
//	<!-- test: run -->                   run as pasted: bash -e in the repository's root
//	<!-- test: run; want: 200 429 -->    ...and its output (stdout and stderr, whitespace
//	                                     collapsed) contains this text
//	<!-- test: run; exit: 1 -->          ...and it exits with this status (default 0)
//	<!-- test: run; needs: nginx -->     ...when nginx is installed (skipped if not; under
//	                                     CI=true a missing tool fails, as scripts/test.sh installs it)
//	<!-- test: parse -->                 not run (Docker, Kubernetes, Envoy, Redis at an address
//	                                     of yours, long benchmarks): bash -n, and each sluice
//	                                     command's subcommands and flags exist in `sluice CMD --help`
//	<!-- test: rules -->                 a YAML block: `sluice check` accepts it without a warning
//	<!-- test: identity -->              a YAML block: `sluice check --identity` accepts it without a warning
//
// Every ```sh (bash, shell) block needs a marker; other blocks may have one.
// The test builds ./sluice once (as the README's first block does, which
// then finds it up to date), runs the blocks one at a time in file order
// (they use the default ports 8080, 8081, 8082, 8000 and 9000, which no
// other test binds; a lock file serialises two runs on one machine), and
// checks that each block stopped what it started: a block's background
// servers (`&`) share its process group, which must be empty a few seconds
// after the block ends (a second paste finds the ports free); what is left
// is an error, then killed. A block that waits for a server to be ready
// waits for a bounded time and says when it is not (wait loops:
// TestWaitLoops), and the quickstart, run with its port taken, ends with
// that message instead of waiting for ever. It also checks that every
// relative link of these files points at a file and heading that exist,
// and that docs/configuration.md names every flag of serve and proxy.
// With -short, run blocks are skipped.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// block is one fenced code block of a Markdown file.
type block struct {
	file  string // path relative to the repository's root
	line  int    // line of the opening fence, from 1
	lang  string // the fence's info string: sh, yaml, ...
	text  string // the block's lines, without fences or the fence's indentation
	check *marker
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// marker is a parsed <!-- test: ... --> comment.
type marker struct {
	mode  string   // run, parse, rules, identity
	needs []string // programs a run needs
	want  string   // text the output must contain, whitespace collapsed
	exit  int      // the exit status a run must have
}

var markerRE = regexp.MustCompile(`^<!--\s*test:\s*(.*?)\s*-->$`)

// parseMarker parses the inside of a marker: MODE[; KEY: VALUE]...
func parseMarker(s string) (*marker, error) {
	parts := strings.Split(s, ";")
	m := &marker{mode: strings.TrimSpace(parts[0])}
	switch m.mode {
	case "run", "parse", "rules", "identity":
	default:
		return nil, fmt.Errorf("marker %q: mode %q is not run, parse, rules or identity", s, m.mode)
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return nil, fmt.Errorf("marker %q: %q is not KEY: VALUE", s, p)
		}
		switch k {
		case "needs":
			m.needs = strings.Fields(v)
		case "want":
			m.want = collapse(v)
		case "exit":
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("marker %q: exit: %w", s, err)
			}
			m.exit = n
		default:
			return nil, fmt.Errorf("marker %q: unknown key %q (needs, want, exit)", s, k)
		}
	}
	if m.mode != "run" && (m.needs != nil || m.want != "" || m.exit != 0) {
		return nil, fmt.Errorf("marker %q: needs, want and exit are for run blocks", s)
	}
	return m, nil
}

// collapse turns every run of white space into one space.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

var fenceRE = regexp.MustCompile("^( *)```(\\S*)\\s*$")

// parseBlocks returns the fenced blocks of the Markdown file at path (named
// name in messages), each with the marker on the line before it, if any.
func parseBlocks(path, name string) ([]block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	var (
		blocks []block
		errs   []error
		prev   *marker // the marker on the last non-blank line, if any
	)
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := markerRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			mk, err := parseMarker(m[1])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %w", name, i+1, err))
			}
			prev = mk
			if mk == nil {
				prev = &marker{mode: "invalid"}
			}
			if i+1 >= len(lines) || !fenceRE.MatchString(lines[i+1]) {
				errs = append(errs, fmt.Errorf("%s:%d: a test marker must be on the line right before a ``` fence", name, i+1))
			}
			continue
		}
		f := fenceRE.FindStringSubmatch(line)
		if f == nil {
			prev = nil
			continue
		}
		indent, lang := f[1], f[2]
		b := block{file: name, line: i + 1, lang: lang, check: prev}
		prev = nil
		var body []string
		j := i + 1
		for ; j < len(lines); j++ {
			if strings.TrimSpace(lines[j]) == "```" {
				break
			}
			body = append(body, strings.TrimPrefix(lines[j], indent))
		}
		if j == len(lines) {
			errs = append(errs, fmt.Errorf("%s:%d: ``` block not closed", name, i+1))
		}
		b.text = strings.Join(body, "\n") + "\n"
		blocks = append(blocks, b)
		i = j
	}
	return blocks, errors.Join(errs...)
}

// isShell reports whether a block's language is a shell's.
func isShell(lang string) bool { return lang == "sh" || lang == "bash" || lang == "shell" }

// docFiles returns README.md and docs/*.md, relative to the repository's root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, err := filepath.Rel(root, m)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// allBlocks parses every documentation file; a marker mistake or a shell
// block without a marker fails the test.
func allBlocks(t *testing.T, root string) []block {
	t.Helper()
	var all []block
	for _, f := range docFiles(t, root) {
		bs, err := parseBlocks(filepath.Join(root, f), f)
		if err != nil {
			t.Error(err)
		}
		for _, b := range bs {
			switch {
			case b.check == nil && isShell(b.lang):
				t.Errorf("%v: a ```%s block without a <!-- test: run|parse --> marker on the line before it", b, b.lang)
			case b.check != nil && isShell(b.lang) && b.check.mode != "run" && b.check.mode != "parse":
				t.Errorf("%v: a shell block is run or parsed, not %q", b, b.check.mode)
			case b.check != nil && !isShell(b.lang) && (b.check.mode == "run" || b.check.mode == "parse"):
				t.Errorf("%v: a ```%s block cannot be %s: mark shell blocks so", b, b.lang, b.check.mode)
			}
		}
		all = append(all, bs...)
	}
	return all
}

// TestBlocks checks every marked block of README.md and docs/*.md.
func TestBlocks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := allBlocks(t, root)
	if t.Failed() {
		t.FailNow()
	}
	unlock := lock(t)
	defer unlock()

	tmp := t.TempDir()
	sluice := buildSluice(t, root)
	// Blocks of docs/ call sluice by name, as once it is installed.
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sluice, filepath.Join(bin, "sluice")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+tmp)
	r := &runner{root: root, tmp: tmp, env: env, sluice: sluice, help: map[string]*help{}}
	before := untracked(t, root)
	for _, b := range blocks {
		if b.check == nil {
			continue
		}
		t.Run(strings.ReplaceAll(b.String(), "/", "_"), func(t *testing.T) {
			start := time.Now()
			switch b.check.mode {
			case "run":
				r.run(t, b)
			case "parse":
				r.parse(t, b)
			case "rules":
				r.yaml(t, b, "check")
			case "identity":
				r.yaml(t, b, "check", "--identity")
			}
			t.Logf("%v (%s) in %v", b, b.check.mode, time.Since(start).Round(time.Millisecond))
		})
	}
	t.Run("flags", func(t *testing.T) { r.flagsDocumented(t) })
	t.Run("port taken", func(t *testing.T) { r.portTaken(t, blocks) })
	if after := untracked(t, root); after != before {
		t.Errorf("the blocks left files in the repository (git status before:\n%s\nafter:\n%s)", before, after)
	}
}

// buildSluice builds ./sluice in the repository's root, as the README's
// first block does (which then finds it up to date), and returns its path.
// A checkout found without one is left without one.
func buildSluice(t *testing.T, root string) string {
	t.Helper()
	sluice := filepath.Join(root, "sluice")
	if _, err := os.Stat(sluice); errors.Is(err, os.ErrNotExist) {
		t.Cleanup(func() { os.Remove(sluice) })
	}
	start := time.Now()
	build := exec.Command("go", "build", "-o", "sluice", "./cmd/sluice")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -o sluice ./cmd/sluice: %v\n%s", err, out)
	}
	t.Logf("built ./sluice in %v", time.Since(start).Round(time.Millisecond))
	return sluice
}

// runner runs and parses blocks.
type runner struct {
	root, tmp string
	env       []string
	sluice    string
	help      map[string]*help // by subcommand path, "" for the root
}

// runTimeout bounds one block (a go run's build on a loaded 2-core machine
// included): a server that did not start leaves a block waiting for it.
const runTimeout = 2 * time.Minute

// defaultPorts are the ports the blocks use without naming them (sluice
// serve's defaults) besides those they name.
var defaultPorts = []int{8000, 8080, 8081, 8082, 9000}

var portRE = regexp.MustCompile(`(?:localhost|127\.0\.0\.1|\s):(\d{4,5})\b`)

// run runs a block as pasted into bash -e and checks its exit status and
// output; a block whose output misses its want text is run once more, as a
// loop of calls can straddle the start of a fixed window.
func (r *runner) run(t *testing.T, b block) {
	for _, tool := range b.check.needs {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%v needs %s, which is not installed (scripts/test.sh installs it)", b, tool)
			}
			t.Skipf("%v needs %s, which is not installed", b, tool)
		}
	}
	if testing.Short() {
		t.Skip("-short: run blocks are not run")
	}
	ports := slices.Clone(defaultPorts)
	for _, m := range portRE.FindAllStringSubmatch(b.text, -1) {
		if p, err := strconv.Atoi(m[1]); err == nil && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	script := filepath.Join(r.tmp, "block.sh")
	if err := os.WriteFile(script, []byte(b.text), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		waitFree(t, ports)
		code, out := r.bash(t, script)
		if code != b.check.exit {
			t.Fatalf("%v exited with status %d, want %d (line N of block.sh is line %d+N of %s); output:\n%s",
				b, code, b.check.exit, b.line, b.file, out)
		}
		if strings.Contains(collapse(out), b.check.want) {
			return
		}
		if attempt == 2 {
			t.Fatalf("%v: the output does not contain %q (twice); output:\n%s", b, b.check.want, out)
		}
		t.Logf("%v: the output does not contain %q; running it again (a window may have started mid-loop); output:\n%s", b, b.check.want, out)
	}
}

// bash runs script with bash -e in the repository's root, in a process group
// of its own that is killed when it ends, and returns its exit status and
// output.
func (r *runner) bash(t *testing.T, script string) (int, string) {
	t.Helper()
	// A file, not a pipe: background servers keep their output open after
	// bash exits, and Wait would wait for them.
	out, err := os.CreateTemp(r.tmp, "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = r.root, r.env, out, out
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if left := leftRunning(cmd.Process.Pid, leftGrace); left != "" {
		t.Errorf("the block left running, %v after it ended, what it started (a second paste would find the port taken): %s; stop it in the block (kill %%1; a `go run` leaves its program running: build it, then run it)", leftGrace, left)
	}
	killGroup(t, cmd.Process.Pid)
	data, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	if ctx.Err() != nil {
		t.Fatalf("the block ran longer than %v; output:\n%s", runTimeout, data)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(data)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(data)
	default:
		t.Fatalf("bash: %v", err)
		return 0, ""
	}
}

// notReady is in what a block says when a server it started is not ready
// in time (a port taken, a mistake in its flags): "sluice is not ready
// after 10 s: see its log above".
const notReady = " after 10 s: see "

// portTaken runs the README's quickstart with its port 8080 taken by a
// server that is never ready (503): the block must end, saying so and
// showing sluice's error, rather than wait for ever.
func (r *runner) portTaken(t *testing.T, blocks []block) {
	if testing.Short() {
		t.Skip("-short: run blocks are not run")
	}
	var quick *block
	for i, b := range blocks {
		if b.file == "README.md" && b.check != nil && b.check.mode == "run" && strings.Contains(b.text, "sluice serve") {
			quick = &blocks[i]
			break
		}
	}
	if quick == nil {
		t.Fatal("README.md has no run block that starts sluice serve")
	}
	waitFree(t, defaultPorts)
	ln, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	squatter := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not me", http.StatusServiceUnavailable)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = squatter.Serve(ln) }()
	defer squatter.Close()
	script := filepath.Join(r.tmp, "block.sh")
	if err := os.WriteFile(script, []byte(quick.text), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, out := r.bash(t, script)
	if !strings.Contains(out, "sluice is not ready"+notReady) || !strings.Contains(out, "--http-addr 127.0.0.1:8080: address already in use") {
		t.Errorf("%v with port 8080 taken: exit status %d after %v, want %q and sluice's own error; output:\n%s",
			quick, code, time.Since(start).Round(time.Millisecond), "sluice is not ready"+notReady, out)
	}
}

// TestWaitLoops: a block that waits for a server waits a bounded time,
// each try too (curl --max-time, --retry), and says when the server is not
// ready (|| echo '... is not ready after ...'), never in an until loop that
// spins for ever when the server failed to start.
func TestWaitLoops(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	loop := regexp.MustCompile(`^\s*(until|while\s+!)\s`)
	for _, b := range allBlocks(t, root) {
		if !isShell(b.lang) {
			continue
		}
		for _, line := range logicalLines(b.text) {
			switch {
			case loop.MatchString(line):
				t.Errorf("%v: %q waits in a loop that never ends if the server does not start: use curl -m 2 --retry 10 --retry-delay 1 --retry-connrefused ... || echo 'sluice is not ready%s...'", b, line, notReady)
			case strings.Contains(line, "--retry") && (!strings.Contains(line, "|| echo") || !strings.Contains(line, notReady)):
				t.Errorf("%v: %q says nothing when the server is not ready: end it with || echo 'sluice is not ready%s...'", b, line, notReady)
			case strings.Contains(line, "--retry") && !strings.Contains(line, " -m "):
				t.Errorf("%v: %q: each try needs a bound (-m 2): a server that accepts and never answers holds it", b, line)
			}
		}
	}
}

// logicalLines returns the lines of a shell script with those continued
// by a final backslash joined.
func logicalLines(text string) []string {
	var out []string
	cur := ""
	for _, l := range strings.Split(text, "\n") {
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur += c
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	return out
}

// leftGrace is how long a block's background processes have to end after
// it ended (a server drains for a moment after kill).
const leftGrace = 5 * time.Second

// leftRunning waits up to grace for every process of group pgid to end and
// returns the command lines of those still running, or "".
func leftRunning(pgid int, grace time.Duration) string {
	deadline := time.Now().Add(grace)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return strings.Join(groupCommands(pgid), "; ")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

// groupCommands returns the command lines of the processes of group pgid
// (zombies left out).
func groupCommands(pgid int) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// killGroup stops every process of the group pgid: SIGTERM, then SIGKILL
// for those still there 5 s later.
func killGroup(t *testing.T, pgid int) {
	t.Helper()
	if err := syscall.Kill(-pgid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !groupAlive(pgid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("process group %d still running 5 s after SIGTERM: SIGKILL", pgid)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// groupAlive reports whether a process of group pgid is still running
// (zombies waiting for their parent do not count).
func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// waitFree waits until nothing listens on the ports on loopback, for at
// most 15 s (what the last block left is stopping).
func waitFree(t *testing.T, ports []int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for _, p := range ports {
		for {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err == nil {
				l.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("port %d is in use (%v): the documentation's blocks need it; stop what listens there", p, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// lock serialises runs of this test on one machine (two worktrees, two
// engineers): the blocks bind fixed ports.
func lock(t *testing.T) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "sluice-docs-blocks.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { f.Close() }
}

// untracked returns git's list of untracked files, or "" outside a checkout.
func untracked(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command("git", "status", "--porcelain", "--untracked-files=all")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "??") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

var tableFlagRE = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)")

// flagsDocumented checks that docs/configuration.md names every flag of
// sluice serve and sluice proxy, and that each flag its tables name (a
// row that starts with one) is a flag of one of them.
func (r *runner) flagsDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(r.root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	known := map[string]bool{}
	for _, cmd := range []string{"serve", "proxy"} {
		h, err := r.helpOf([]string{cmd})
		if err != nil {
			t.Fatal(err)
		}
		for f := range h.flags {
			known[f] = true
			if f != "help" && f != "h" && !strings.Contains(doc, "`--"+f+"`") && !strings.Contains(doc, "`--"+f+" ") {
				t.Errorf("docs/configuration.md does not name sluice %s's flag --%s", cmd, f)
			}
		}
	}
	for i, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		for _, m := range tableFlagRE.FindAllStringSubmatch(first, -1) {
			if !known[m[1]] {
				t.Errorf("docs/configuration.md:%d: --%s is a flag of neither sluice serve nor sluice proxy", i+1, m[1])
			}
		}
	}
}

// yaml checks a YAML block with sluice check (args, then the file): it must
// pass without a warning.
func (r *runner) yaml(t *testing.T, b block, args ...string) {
	path := filepath.Join(r.tmp, strings.ReplaceAll(b.String(), "/", "_")+".yaml")
	if err := os.WriteFile(path, []byte(b.text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(r.sluice, append(args, path)...)
	cmd.Dir = r.root
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("warning: ")) {
		t.Errorf("%v: sluice %s: %v\n%s", b, strings.Join(args, " "), err, out)
	}
}

// parse checks a block that is not run: bash -n, and every sluice command's
// subcommands and flags.
func (r *runner) parse(t *testing.T, b block) {
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = strings.NewReader(b.text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: bash -n: %v\n%s", b, err, out)
	}
	for _, c := range commands(b.text) {
		args, ok := sluiceArgs(c.words)
		if !ok {
			continue
		}
		if err := r.checkArgs(args); err != nil {
			t.Errorf("%s:%d: %s: %v", b.file, b.line+c.line, strings.Join(c.words, " "), err)
		}
	}
}

var assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// sluiceArgs returns the arguments of a command that runs sluice (sluice,
// ./sluice, .../sluice, go run ./cmd/sluice), after any VAR=value words.
func sluiceArgs(words []string) ([]string, bool) {
	for len(words) > 0 && assignRE.MatchString(words[0]) {
		words = words[1:]
	}
	switch {
	case len(words) == 0:
		return nil, false
	case words[0] == "sluice" || strings.HasSuffix(words[0], "/sluice"):
		return words[1:], true
	case len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/sluice":
		return words[3:], true
	}
	return nil, false
}

// help is what `sluice CMD --help` says: its flags and subcommands.
type help struct {
	flags map[string]bool
	subs  map[string]bool
}

var helpFlagRE = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// helpOf returns the help of the subcommand path.
func (r *runner) helpOf(path []string) (*help, error) {
	key := strings.Join(path, " ")
	if h, ok := r.help[key]; ok {
		return h, nil
	}
	cmd := exec.Command(r.sluice, append(slices.Clone(path), "--help")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no SLUICE_ or Envoy variables
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("sluice %s --help: %w", key, err)
	}
	h := &help{flags: map[string]bool{"help": true, "h": true}, subs: map[string]bool{}}
	for _, m := range helpFlagRE.FindAllStringSubmatch(string(out), -1) {
		h.flags[m[1]] = true
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	in := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "SUBCOMMANDS":
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in:
			if f := strings.Fields(line); len(f) > 0 {
				h.subs[f[0]] = true
			}
		}
	}
	r.help[key] = h
	return h, nil
}

// checkArgs checks a sluice command line's subcommands and flag names.
func (r *runner) checkArgs(args []string) error {
	var path []string
	h, err := r.helpOf(nil)
	if err != nil {
		return err
	}
	name := func() string { return strings.Join(append([]string{"sluice"}, path...), " ") }
	for i, a := range args {
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			flag, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !h.flags[flag] {
				return fmt.Errorf("%s has no flag --%s", name(), flag)
			}
			continue
		}
		if len(h.subs) == 0 {
			continue // an argument
		}
		if !h.subs[a] {
			if len(path) == 0 || i == 0 || !strings.HasPrefix(args[i-1], "-") {
				return fmt.Errorf("%s has no subcommand %q", name(), a)
			}
			continue // a flag's value
		}
		path = append(path, a)
		if h, err = r.helpOf(path); err != nil {
			return err
		}
	}
	return nil
}

// command is one simple command of a shell block, as words.
type command struct {
	line  int // of the block, from 1
	words []string
}

// commands splits a shell block into simple commands: lines joined at a
// trailing backslash, here-documents dropped, words split as the shell
// splits them (quotes kept apart, $(...) one word), at ; & | && || and
// comments. Enough for the documentation's blocks, not a shell.
func commands(text string) []command {
	var (
		out     []command
		words   []string
		word    strings.Builder
		inWord  bool
		heredoc string
		start   = 1
	)
	flush := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	end := func() {
		flush()
		if len(words) > 0 {
			out = append(out, command{line: start, words: words})
		}
		words = nil
	}
	lines := strings.Split(text, "\n")
	for n := 0; n < len(lines); n++ {
		line := lines[n]
		if heredoc != "" {
			if strings.TrimSpace(line) == heredoc {
				heredoc = ""
			}
			continue
		}
		if len(words) == 0 && !inWord {
			start = n + 1
		}
		if i := strings.Index(line, "<<"); i >= 0 && !strings.HasPrefix(line[i:], "<<<") {
			if f := strings.Fields(line[i+2:]); len(f) > 0 {
				heredoc = strings.Trim(f[0], `'"-`)
			}
			line = line[:i]
		}
		cont := strings.HasSuffix(line, "\\")
		line = strings.TrimSuffix(line, "\\")
		for i := 0; i < len(line); i++ {
			c := line[i]
			switch {
			case c == '\'' || c == '"':
				j := strings.IndexByte(line[i+1:], c)
				if j < 0 {
					j = len(line) - i - 1
				}
				word.WriteString(line[i+1 : i+1+j])
				inWord = true
				i += j + 1
			case c == '$' && i+1 < len(line) && line[i+1] == '(':
				depth, j := 0, i+1
				for ; j < len(line); j++ {
					if line[j] == '(' {
						depth++
					} else if line[j] == ')' {
						depth--
						if depth == 0 {
							break
						}
					}
				}
				word.WriteString(line[i:min(j+1, len(line))])
				inWord = true
				i = j
			case c == '#' && !inWord:
				i = len(line)
			case c == ';' || c == '&' || c == '|':
				end()
			case c == ' ' || c == '\t':
				flush()
			case c == '\\' && i+1 < len(line):
				word.WriteByte(line[i+1])
				inWord = true
				i++
			default:
				word.WriteByte(c)
				inWord = true
			}
		}
		if !cont {
			end()
		}
	}
	end()
	return out
}

// TestLinks checks that every relative link of README.md and docs/*.md
// points at a file that exists and, with a #fragment into a Markdown file,
// at one of its headings.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := headingAnchors(t, path)
		anchors[path] = a
		return a
	}
	for _, f := range docFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(data), "\n") {
			if fenceRE.MatchString(line) || strings.TrimSpace(line) == "```" {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				full := filepath.Join(root, filepath.Dir(f), path)
				if path == "" {
					full = filepath.Join(root, f)
				}
				if _, err := os.Stat(full); err != nil {
					t.Errorf("%s:%d: link %s: %v", f, i+1, target, err)
					continue
				}
				if frag != "" && strings.HasSuffix(full, ".md") && !anchorsOf(full)[frag] {
					t.Errorf("%s:%d: link %s: no heading with that anchor in %s", f, i+1, target, filepath.Base(full))
				}
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, punctuation dropped, spaces as hyphens, a
// repeated one suffixed -1, -2...
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if fenceRE.MatchString(line) || strings.TrimSpace(line) == "```" {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				s.WriteByte('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127 && !strings.ContainsRune("’‘“”…—–", r):
				s.WriteRune(r)
			}
		}
		a := s.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
