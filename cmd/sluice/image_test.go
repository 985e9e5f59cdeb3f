package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
)

// dockerfile is the image's Dockerfile, as the commands it runs.
type dockerfile struct {
	rootfs string   // the build stage's RUN line that lays out the image's files
	copies []string // the last stage's COPY lines
	from   string   // the last stage's base
	env    []string // ENV KEY=VALUE, in order
	user   string   // USER
	cmd    []string // ENTRYPOINT then CMD
}

// readDockerfile reads the repository's Dockerfile. It knows the few
// instructions that file uses, one per line.
func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	var entry, cmd []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		instr, rest, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch instr {
		case "FROM": // only the last stage is the image
			d.from, d.copies, d.env, d.user = rest, nil, nil, ""
		case "RUN": // in the build stage
			if strings.Contains(rest, "rootfs.sh") {
				d.rootfs = rest
			}
		case "COPY":
			d.copies = append(d.copies, rest)
		case "ENV":
			d.env = append(d.env, strings.Fields(rest)...)
		case "USER":
			d.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &entry); err != nil {
				t.Fatalf("ENTRYPOINT %s: %v", rest, err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(rest), &cmd); err != nil {
				t.Fatalf("CMD %s: %v", rest, err)
			}
		}
	}
	d.cmd = append(entry, cmd...)
	return d
}

// TestStaticBinary lays out the image's files as the Dockerfile does
// (deploy/image/rootfs.sh, whose output its last stage copies whole onto
// an empty base), checks that the binary is static, and runs it as the
// image runs it: as root, in a chroot holding nothing but those files (no
// /etc/hosts, no /dev, no /proc), as the image's unprivileged user, with
// the image's environment and nothing else; it must serve /healthz and a
// decision on all interfaces. Without root it runs the binary with an
// empty environment in an empty directory instead. deploy/image's tests
// build the image itself and run it on a Docker Engine.
func TestStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice: not in -short")
	}
	t.Parallel()
	d := readDockerfile(t)
	if d.rootfs != "deploy/image/rootfs.sh /out" {
		t.Fatalf("the Dockerfile's build stage runs %q, want deploy/image/rootfs.sh /out", d.rootfs)
	}
	if d.from != "scratch" || !slices.Equal(d.copies, []string{"--from=build /out/ /"}) {
		t.Fatalf("the image is FROM %s with COPY %q, want FROM scratch with rootfs.sh's files alone", d.from, d.copies)
	}
	if d.user == "" || strings.HasPrefix(d.user, "0") || strings.HasPrefix(d.user, "root") {
		t.Fatalf("the Dockerfile's USER is %q, want an unprivileged user", d.user)
	}
	uid, gid := userIDs(t, d.user)
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build with")
	}

	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("../../deploy/image/rootfs.sh", root).CombinedOutput(); err != nil {
		t.Fatalf("rootfs.sh: %v\n%s", err, out)
	}
	bin := filepath.Join(root, d.cmd[0])
	checkStatic(t, bin)
	checkImageConfig(t, d, root)
	if link, err := os.Readlink(filepath.Join(root, "bin/ratelimit")); err != nil || link != d.cmd[0] {
		t.Errorf("the image's /bin/ratelimit links to %q (%v), want %s, as Envoy ratelimit's Deployments run it", link, err, d.cmd[0])
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), fmt.Sprintf(":x:%d:%d:", uid, gid)) {
		t.Errorf("the image's /etc/passwd names no user %d:%d (%v):\n%s", uid, gid, err, passwd)
	}

	t.Run("as the image runs", func(t *testing.T) {
		// The image's command, on free ports, still on all interfaces,
		// with JSON logs to find them.
		args := append(d.cmd[1:], "--grpc-addr", ":0", "--http-addr", ":0", "--log-format", "json")
		if os.Geteuid() != 0 {
			t.Log("not root: running with an empty environment in an empty directory, without chroot")
			runImage(t, "", append([]string{bin}, append(args,
				"--config", filepath.Join(root, "etc/sluice/sluice.yaml"),
				"--rules", filepath.Join(root, "etc/sluice/rules"))...), nil, 0, 0, true)
			return
		}
		runImage(t, root, append([]string{d.cmd[0]}, args...), d.env, uid, gid, true)
	})
	t.Run("as Envoy ratelimit's Deployment runs it", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to chroot")
		}
		// Envoy's rules layout, and its environment on free ports.
		rules, err := os.ReadFile(exampleRules)
		if err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(root, "srv/runtime_data/current/ratelimit/config")
		if err := os.MkdirAll(cfg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg, "config.yaml"), rules, 0o644); err != nil {
			t.Fatal(err)
		}
		env := append(slices.Clone(d.env), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			"REDIS_SOCKET_TYPE=tcp", "USE_STATSD=false", "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0",
			"LOG_LEVEL=info", "LOG_FORMAT=json", "SLUICE_STORE=memory") // no Redis here: not Envoy's default socket
		runImage(t, root, []string{"/bin/ratelimit"}, env, uid, gid, false)
	})
}

// runImage runs argv in root as uid:gid with env and nothing else (or,
// with root "", argv as it is with an empty environment in an empty
// directory), waits until it listens on all interfaces, checks that it
// serves health and a decision (/v1/decide with sluice's response headers,
// or Envoy's /healthcheck and /json), and stops it with SIGTERM.
func runImage(t *testing.T, root string, argv, env []string, uid, gid uint32, sluiceWay bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	if env == nil {
		cmd.Env = []string{}
	}
	if root != "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Chroot:     root,
			Credential: &syscall.Credential{Uid: uid, Gid: gid},
		}
		cmd.Dir = "/"
	} else {
		cmd.Dir = t.TempDir()
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Logs{}
	listening := make(chan map[string]any, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(io.TeeReader(stderr, logs))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && testenv.Message(rec) == "listening" {
				listening <- rec
			}
		}
	}()
	var rec map[string]any
	select {
	case rec = <-listening:
	case <-copied:
		t.Fatalf("sluice ended before listening: %v\n%s", cmd.Wait(), logs)
	}

	httpAddr, _ := rec["http_addr"].(string)
	host, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Errorf("HTTP listens on %s, want all interfaces", httpAddr)
	}
	base := "http://" + net.JoinHostPort("127.0.0.1", port)
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(method, path, body string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	health, decide := "/healthz", "/v1/decide"
	if !sluiceWay {
		health, decide = "/healthcheck", "/json"
	}
	if code, body := get("GET", health, ""); code != 200 {
		t.Errorf("%s = %d %s", health, code, body)
	}
	code, body := get("POST", decide, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"},{"key":"path","value":"/login"}]}]}`)
	if code != 200 || !strings.Contains(body, `"overallCode":"OK"`) || !strings.Contains(body, `"requestsPerUnit":5`) {
		t.Errorf("%s = %d %s, want OK under the example's login limit of 5", decide, code, body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-copied
	if err := cmd.Wait(); err != nil {
		t.Errorf("sluice after SIGTERM: %v\n%s", err, logs)
	}
	client.CloseIdleConnections()
}

// userIDs returns the uid and gid of a Dockerfile USER given as numbers.
func userIDs(t *testing.T, user string) (uint32, uint32) {
	t.Helper()
	u, g, _ := strings.Cut(user, ":")
	uid, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		t.Fatalf("USER %q: want numeric ids (a scratch-like image has no /etc/passwd to look names up in)", user)
	}
	gid := uid
	if g != "" {
		if gid, err = strconv.ParseUint(g, 10, 32); err != nil {
			t.Fatalf("USER %q: %v", user, err)
		}
	}
	return uint32(uid), uint32(gid)
}

// checkStatic fails unless the ELF file at path asks for no dynamic loader
// and no shared library.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v segment: not static", path, p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("%s needs %v", path, libs)
	}
}

// checkImageConfig checks that the config file the image's environment
// names sets both listeners to all interfaces.
func checkImageConfig(t *testing.T, d dockerfile, root string) {
	t.Helper()
	var path string
	for _, kv := range d.env {
		if k, v, _ := strings.Cut(kv, "="); k == envKey(configFlag) {
			path = v
		}
	}
	if path == "" {
		t.Fatalf("the Dockerfile sets no %s", envKey(configFlag))
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatalf("%s: %v (not copied into the image?)", path, err)
	}
	fs := serveFlags(t)
	if err := applyConfig(fs, path, data); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"grpc-addr", "http-addr"} {
		host, _, err := net.SplitHostPort(flagValue(t, fs, name))
		if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
			t.Errorf("the image's %s is %q, want all interfaces", name, flagValue(t, fs, name))
		}
	}
}

// TestDeployRules checks that the rules of the Kubernetes ConfigMap under
// deploy/ load: deploy's own tests decode the manifests, but do not depend
// on sluice's module.
func TestDeployRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../deploy/kubernetes/sluice/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Kind != "ConfigMap" || len(cm.Data) == 0 {
		t.Fatalf("deploy/kubernetes/sluice/rules.yaml: a %s with %d files, want a ConfigMap of rules", cm.Kind, len(cm.Data))
	}
	for name, src := range cm.Data {
		if _, err := rules.Parse(name, []byte(src)); err != nil {
			t.Errorf("ConfigMap sluice-rules, %s: %v", name, err)
		}
	}
}
