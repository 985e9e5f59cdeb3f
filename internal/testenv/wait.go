package testenv

import (
	"testing"
	"time"
)

// WaitFor polls cond every millisecond until it holds, failing t with
// "timed out waiting for what" after 10 s. The 10 s bound a hang only: a
// test waits on the condition, never for time to pass.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
