package testenv

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// server starts cmd, a server called name in messages, and waits up to
// wait until it accepts connections on 127.0.0.1:port; it fails the test
// if the server exits first or does not listen in time. The server is
// stopped when the test ends (SIGINT, then SIGKILL after 5 s), and its
// output, followed by what more returns (a log file, say; more may be
// nil), is shown if the test failed.
func server(t testing.TB, name string, cmd *exec.Cmd, port int, wait time.Duration, more func() string) {
	t.Helper()
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	shown := func() string {
		if more == nil {
			return out.String()
		}
		return out.String() + "\n" + more()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // owned by the cleanup below, which waits for it
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, shown())
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(wait)
	for {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("%s exited: %v\n%s", name, err, shown())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not listen on %s after %v: %v\n%s", name, addr, wait, err, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling for a server to start, not for a window
	}
}
