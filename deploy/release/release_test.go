// Package release holds the test of scripts/release.sh: it builds a
// release of the repository's HEAD twice, into two directories, for
// linux/amd64 alone (the script's default is all four platforms, which
// takes longer than CI should), and checks what a user verifies: the
// checksums file matches the files, the two builds give the same archives
// and SBOM byte for byte, the archive's entries are sorted with the
// commit's time and owner 0, its binary says the version, commit and date,
// the SBOM is CycloneDX naming the version and the module graph, and the
// image carries its OCI labels.
//
// It needs git, GNU tar, the module proxy or a module cache holding
// cyclonedx-gomod, and a Docker Engine: it fails under CI=true when one
// is missing, and skips otherwise.
package release

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// missing fails the test under CI=true, where every tool is installed,
// and skips it otherwise.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped outside CI)", args...)
}

// git runs git in the repository and returns its trimmed output. A
// release is of a commit: outside a git checkout (a copy of the files)
// there is none, and the test skips, CI or not, saying so.
func git(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", "../.."}, args...)...).Output()
	if err != nil {
		t.Skipf("git %v: %v: not a git checkout, no commit to release", args, err)
	}
	return strings.TrimSpace(string(out))
}

// release runs scripts/release.sh for linux/amd64 into dir with the image
// named image, and returns the files it wrote by name.
func release(t *testing.T, dir, image string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "../../scripts/release.sh")
	cmd.Env = append(os.Environ(), "PLATFORMS=linux/amd64", "DIST="+dir, "IMAGE_NAME="+image, "VERSION=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		files[e.Name()] = filepath.Join(dir, e.Name())
	}
	return files
}

// checksums reads a sha256sum file: file name to hex digest.
func checksums(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("%s: line %q is not sha256sum's", path, sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestRelease builds the release twice and checks it (see the package doc).
func TestRelease(t *testing.T) {
	if _, err := exec.LookPath("docker"); err != nil {
		missing(t, "no docker: %v", err)
	}
	if err := exec.Command("docker", "version").Run(); err != nil {
		missing(t, "no Docker Engine answers: %v", err)
	}
	if out, err := exec.Command("tar", "--version").Output(); err != nil || !strings.Contains(string(out), "GNU tar") {
		missing(t, "no GNU tar: %v", err)
	}
	commit := git(t, "rev-parse", "HEAD")
	epoch, err := strconv.ParseInt(git(t, "log", "-1", "--format=%ct", "HEAD"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	date := time.Unix(epoch, 0).UTC().Format(time.RFC3339)

	image := fmt.Sprintf("sluice-test-release-%d", os.Getpid())
	t.Cleanup(func() {
		out, _ := exec.Command("docker", "image", "ls", "-q", image).Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("docker", "rmi", "-f", id).Run()
		}
	})
	a, b := release(t, t.TempDir(), image), release(t, t.TempDir(), image)

	// The names: one archive, the SBOM, the image and the checksums, of one version.
	var version string
	for name := range a {
		if v, ok := strings.CutSuffix(name, "_checksums.txt"); ok {
			version = strings.TrimPrefix(v, "sluice_")
		}
	}
	want := []string{
		"sluice_" + version + "_checksums.txt",
		"sluice_" + version + "_image.tar",
		"sluice_" + version + "_linux_amd64.tar.gz",
		"sluice_" + version + "_sbom.cdx.json",
	}
	var got []string
	for name := range a {
		got = append(got, name)
	}
	slices.Sort(got)
	if version == "" || !slices.Equal(got, want) {
		t.Fatalf("dist/ holds %v, want %v", got, want)
	}
	tag, _ := exec.Command("git", "-C", "../..", "describe", "--tags", "--exact-match", "--match", "v[0-9]*", "HEAD").Output()
	if tagged := strings.TrimSpace(string(tag)); tagged != "" {
		if version != tagged {
			t.Errorf("version %q: want the tag at HEAD, %s", version, tagged)
		}
	} else if !strings.HasPrefix(version, "v") || !strings.HasSuffix(version, "-"+commit[:12]) {
		t.Errorf("version %q: want a pseudo-version ending in the commit %s (HEAD is not tagged)", version, commit[:12])
	}

	// The checksums file covers every other file, and matches it.
	sumsA, sumsB := checksums(t, a[want[0]]), checksums(t, b[want[0]])
	for _, name := range want[1:] {
		if sumsA[name] == "" {
			t.Errorf("the checksums file does not list %s", name)
		} else if got := sha256File(t, a[name]); got != sumsA[name] {
			t.Errorf("%s: sha256 %s, the checksums file says %s", name, got, sumsA[name])
		}
	}
	if len(sumsA) != len(want)-1 {
		t.Errorf("the checksums file lists %d files, want %d", len(sumsA), len(want)-1)
	}
	// Reproducible: the second build's archive and SBOM are the first's.
	for _, name := range []string{want[2], want[3]} {
		if sumsA[name] != sumsB[name] {
			t.Errorf("%s differs between two builds of one commit: %s, then %s", name, sumsA[name], sumsB[name])
		}
	}

	checkArchive(t, a[want[2]], "sluice_"+version+"_linux_amd64", epoch, fmt.Sprintf("sluice %s (commit %s, %s)", version, commit[:12], date))
	checkSBOM(t, a[want[3]], version)
	checkImage(t, image+":"+version, version, commit, date)
}

// checkArchive checks the archive's entries (the directory dir, sorted,
// the commit's time, owner 0, the modes) and that its binary, run here,
// prints the version line wantVersion.
func checkArchive(t *testing.T, path, dir string, epoch int64, wantVersion string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("the gzip header holds a name %q or a time %v: want gzip -n", zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	var names []string
	bin := filepath.Join(t.TempDir(), "sluice")
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.ModTime.Unix() != epoch || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v, owner %d:%d %q:%q; want the commit's time and 0:0", h.Name, h.ModTime.Unix(), h.Uid, h.Gid, h.Uname, h.Gname)
		}
		mode := map[bool]int64{true: 0o755, false: 0o644}[h.Typeflag == tar.TypeDir || strings.HasSuffix(h.Name, "/sluice")]
		if h.Mode&0o777 != mode {
			t.Errorf("%s: mode %o, want %o", h.Name, h.Mode&0o777, mode)
		}
		if strings.HasSuffix(h.Name, "/sluice") {
			out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	}
	wantNames := []string{dir + "/", dir + "/CHANGELOG.md", dir + "/LICENSE", dir + "/README.md", dir + "/SECURITY.md", dir + "/sluice"}
	if !slices.Equal(names, wantNames) {
		t.Errorf("the archive holds %v, want %v in this order", names, wantNames)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), wantVersion+" go") {
		t.Errorf("sluice version printed %q, want %q and the Go version", out, wantVersion)
	}
}

// checkSBOM checks that the SBOM is CycloneDX JSON naming sluice at
// version and the modules sluice is built from.
func checkSBOM(t *testing.T, path, version string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat   string `json:"bomFormat"`
		SpecVersion string `json:"specVersion"`
		Metadata    struct {
			Component struct{ Name, Version string } `json:"component"`
		} `json:"metadata"`
		Components []struct{ Name, Version string } `json:"components"`
	}
	if err := json.Unmarshal(data, &bom); err != nil {
		t.Fatalf("SBOM: %v", err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion == "" {
		t.Errorf("SBOM format %q %q, want CycloneDX", bom.BOMFormat, bom.SpecVersion)
	}
	if c := bom.Metadata.Component; c.Name != "github.com/sluicehq/sluice" || c.Version != version {
		t.Errorf("SBOM's component is %s %s, want github.com/sluicehq/sluice %s", c.Name, c.Version, version)
	}
	// Modules of sluice's go.mod that the binary links.
	for _, mod := range []string{"github.com/redis/rueidis", "google.golang.org/grpc", "github.com/prometheus/client_golang"} {
		found := false
		for _, c := range bom.Components {
			found = found || c.Name == mod && c.Version != ""
		}
		if !found {
			t.Errorf("SBOM lacks module %s", mod)
		}
	}
}

// checkImage checks the OCI labels of the image the release built.
func checkImage(t *testing.T, ref, version, commit, date string) {
	t.Helper()
	out, err := exec.Command("docker", "image", "inspect", "--format", "{{json .Config.Labels}}", ref).Output()
	if err != nil {
		t.Fatalf("docker image inspect %s: %v", ref, err)
	}
	var labels map[string]string
	if err := json.Unmarshal(out, &labels); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": commit,
		"org.opencontainers.image.created":  date,
		"org.opencontainers.image.source":   "https://github.com/sluicehq/sluice",
		"org.opencontainers.image.licenses": "MIT",
	} {
		if labels[k] != v {
			t.Errorf("image label %s = %q, want %q", k, labels[k], v)
		}
	}
}
