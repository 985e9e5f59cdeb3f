package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if any goroutine outlives them: every server,
// watcher, store and client a test starts must be stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
