package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
)

// process is sluice running as a process of its own: the test binary,
// which runs main with SLUICE_TEST_MAIN=1 (TestMain), with JSON logs.
type process struct {
	cmd  *exec.Cmd
	logs *testenv.Logs
	done chan error // Wait's result
}

// startProcess starts sluice with args (after which it logs JSON) and
// waits until it logs ready ("listening", "proxying"); it is killed if
// still running when the test ends.
func startProcess(t *testing.T, ready string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], append(args, "--log-format", "json")...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	p := &process{cmd: cmd, logs: &testenv.Logs{}, done: make(chan error, 1)}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(p.logs, sc.Text())
		}
	}()
	go func() {
		<-copied // Wait closes the pipe: read it all first
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("sluice's log:\n%s", p.logs)
		}
	})
	p.waitLog(t, ready, nil)
	return p
}

// waitLog waits until the process logs msg (with ok true of the record,
// unless nil) and returns the record; it fails if the process ends first.
func (p *process) waitLog(t *testing.T, msg string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	if ok == nil {
		ok = func(map[string]any) bool { return true }
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if rec := p.logs.FindFunc(msg, ok); rec != nil {
			return rec
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("sluice ended (%v) before logging %q", err, msg)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice did not log %q within 20s", msg)
		}
	}
}

// signal sends sig to the process.
func (p *process) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v: %v", sig, err)
	}
}

// exit waits for the process to end and returns its exit status.
func (p *process) exit(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(20 * time.Second):
		t.Fatal("sluice did not end within 20s")
		return -1
	}
}

// post sends body to url and returns the status code.
func post(t *testing.T, url, body string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestSIGHUPReloads: SIGHUP makes a running `sluice serve` read its rules
// again (here a file behind a symbolic link to another directory, whose
// edit the watch cannot see) and never ends it; a broken edit keeps the
// rules in force. Before, SIGHUP ended the process (exit status 129,
// without a log line): nothing asked to be told of it.
func TestSIGHUPReloads(t *testing.T) {
	t.Parallel()
	real, dir := t.TempDir(), t.TempDir()
	target, path := filepath.Join(real, "rules.yaml"), filepath.Join(dir, "rules.yaml")
	rules := func(n int) string {
		return fmt.Sprintf("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
	}
	writeFile(t, target, rules(100))
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, "listening", "serve", "--rules", path, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
	url := "http://" + p.logs.Find("listening")["http_addr"].(string) + "/json"
	ask := func(user string) int {
		return post(t, url, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`)
	}

	// Three, one after the other's reload (signals sent at once may
	// arrive as one).
	for i := 1; i <= 3; i++ {
		p.signal(t, syscall.SIGHUP)
		eventually(t, fmt.Sprintf("reload %d logged", i), func() bool {
			return strings.Count(p.logs.String(), `"msg":"reloaded"`) == i
		})
	}
	if got := ask("alice"); got != http.StatusOK {
		t.Fatalf("after three SIGHUPs: %d, want 200 (still serving)", got)
	}

	writeFile(t, target, rules(1))
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, "rules reloaded", nil)
	if a, b := ask("bob"), ask("bob"); a != http.StatusOK || b != http.StatusTooManyRequests {
		t.Errorf("after the reload to 1 an hour: bob %d then %d, want 200 then 429", a, b)
	}

	writeFile(t, target, "domain: api\ndescriptors:\n  - key: user\n\trate_limit: {}\n")
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, "reload: the rules in force stay", nil)
	if a, b := ask("carol"), ask("carol"); a != http.StatusOK || b != http.StatusTooManyRequests {
		t.Errorf("after a broken reload: carol %d then %d, want 200 then 429 (1 an hour still)", a, b)
	}

	p.signal(t, syscall.SIGTERM)
	if code := p.exit(t); code != 0 {
		t.Errorf("after SIGTERM: exit status %d, want 0", code)
	}
}

// TestSIGTERMDrains: SIGTERM stops `sluice proxy` from accepting requests,
// lets the one in flight finish (its upstream answers after the signal)
// and ends it with status 0.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		_, _ = io.WriteString(w, "served")
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	p := startProcess(t, "proxying", "proxy", "--upstream", up.URL, "--rules", exampleRules, "--listen", "127.0.0.1:0")
	addr := p.logs.Find("proxying")["listen"].(string)

	type result struct {
		code int
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			res <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		res <- result{resp.StatusCode, string(b), err}
	}()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the request did not reach the upstream within 20s")
	}
	p.signal(t, syscall.SIGTERM)
	p.waitLog(t, "shutting down", nil)
	close(release)
	r := <-res
	if r.err != nil || r.code != http.StatusOK || r.body != "served" {
		t.Errorf("the request in flight at SIGTERM: %d %q %v, want 200 \"served\"", r.code, r.body, r.err)
	}
	if code := p.exit(t); code != 0 {
		t.Errorf("after SIGTERM: exit status %d, want 0", code)
	}
	p.waitLog(t, "stopped", nil)
}

// TestSIGHUPReloadsCertificates: SIGHUP reads the TLS files again; a pair
// that does not match (a new key before its certificate) is logged and the
// certificate in force stays, and the process goes on; the matching pair
// is served after the next SIGHUP.
func TestSIGHUPReloadsCertificates(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t, "test CA")
	a, b := ca.Issue(t, false, "127.0.0.1", "localhost"), ca.Issue(t, false, "127.0.0.1", "localhost")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, cert, string(a.CertPEM))
	writeFile(t, key, string(a.KeyPEM))
	p := startProcess(t, "listening", "serve", "--rules", exampleRules, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--ops-addr", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--tls-listeners", "ops")
	ops := p.logs.Find("listening")["ops_addr"].(string)
	serial := func() string {
		c, err := tls.Dial("tcp", ops, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
		if err != nil {
			t.Fatalf("TLS to the ops listener: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if got := serial(); got != a.Serial.String() {
		t.Fatalf("serial %s, want %s", got, a.Serial)
	}
	writeFile(t, key, string(b.KeyPEM)) // the key of b with the certificate of a
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, "reload: TLS certificates", nil)
	if got := serial(); got != a.Serial.String() {
		t.Errorf("after a broken pair: serial %s, want %s still", got, a.Serial)
	}
	writeFile(t, cert, string(b.CertPEM))
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, "reloaded", func(rec map[string]any) bool { return rec["tls"] == true })
	if got := serial(); got != b.Serial.String() {
		t.Errorf("after the reload: serial %s, want %s", got, b.Serial)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exit(t); code != 0 {
		t.Errorf("after SIGTERM: exit status %d, want 0", code)
	}
}

// TestSIGHUPReadsRulesDatabase: with a rules database and no polling,
// a change written to it without a notification (a restored dump, a
// script) is read at SIGHUP.
func TestSIGHUPReadsRulesDatabase(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	write := func(gen, n int) {
		doc, err := json.Marshal(map[string]any{"domain": "api", "version": gen, "author": "test", "time": "2026-11-28T00:00:00Z",
			"text": fmt.Sprintf("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)})
		if err != nil {
			t.Fatal(err)
		}
		r.CLI("HSET", "{sluice:rules}:domains", "api", string(doc))
		r.CLI("SET", "{sluice:rules}:gen", strconv.Itoa(gen))
	}
	write(1, 1000)
	p := startProcess(t, "listening", "serve", "--rules", "redis://"+r.Addr, "--rules-poll", "-1s",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
	url := "http://" + p.logs.Find("listening")["http_addr"].(string) + "/json"
	ask := func(tenant string) int {
		return post(t, url, `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"`+tenant+`"}]}]}`)
	}
	write(2, 1) // no notification, no poll: unseen until asked
	if a, b := ask("acme"), ask("acme"); a != http.StatusOK || b != http.StatusOK {
		t.Fatalf("before SIGHUP: %d %d, want the 1000 an hour in force", a, b)
	}
	p.signal(t, syscall.SIGHUP)
	p.waitLog(t, "rules reloaded", func(rec map[string]any) bool { return rec["source"] == "signal" })
	if a, b := ask("bolt"), ask("bolt"); a != http.StatusOK || b != http.StatusTooManyRequests {
		t.Errorf("after SIGHUP: bolt %d then %d, want 200 then 429 (1 an hour)", a, b)
	}
}
