package image

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeWant is what the README's Docker block prints: the example rules'
// login limit, five calls and a denial.
const readmeWant = "200 200 200 200 200 429"

// TestReadmeDocker runs the README's Docker block (the ```sh block that
// runs deploy/image/build.sh) as pasted, with bash -e in the repository's
// root: it builds the image, starts it on ports 8080 and 8081, and must
// print five 200s and a 429. docs/blocks_test.go only parses it (its
// marker is parse); the two tests hold one lock while on those ports. A
// loop that straddles a minute's start sees its 429 a call later: such a
// run is tried once more.
func TestReadmeDocker(t *testing.T) {
	t.Parallel()
	requireDocker(t)
	if _, err := exec.LookPath("curl"); err != nil {
		missing(t, "no curl: %v", err)
	}
	block := readmeBlock(t, "../../README.md", "deploy/image/build.sh")
	lockDefaultPorts(t)

	// The block's containers, removed however it ends.
	for _, m := range regexp.MustCompile(`--name[ =](\S+)`).FindAllStringSubmatch(block, -1) {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dockerCtx(ctx, "rm", "-f", m[1])
		})
	}
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-c", block)
		cmd.Dir = "../.."
		start := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("the README's Docker block ran in %s", time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("the README's Docker block: %v\n%s", err, out)
		}
		if strings.Contains(strings.Join(strings.Fields(string(out)), " "), readmeWant) {
			return
		}
		if try == 2 {
			t.Fatalf("the README's Docker block printed no %q:\n%s", readmeWant, out)
		}
	}
}

// readmeBlock returns the first ```sh block of the Markdown file at path
// that contains marker.
func readmeBlock(t *testing.T, path, marker string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var block []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, block = true, nil
		case in && strings.TrimSpace(line) == "```":
			if text := strings.Join(block, "\n") + "\n"; strings.Contains(text, marker) {
				return text
			}
			in = false
		case in:
			block = append(block, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("%s has no ```sh block with %s: the Install section's Docker block, which this test runs", path, marker)
	return ""
}

// lockDefaultPorts holds, until the test ends, the lock that
// docs/blocks_test.go takes while it runs the documentation's blocks on
// the default ports (8080, 8081, ...), so that two tests binding them on
// one machine take turns.
func lockDefaultPorts(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "sluice-docs-blocks.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}
