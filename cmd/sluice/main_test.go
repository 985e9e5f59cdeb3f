package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if any goroutine outlives them: every server,
// watcher, store and client a test starts must be stopped. The exceptions
// are rueidis's own pauses around a Redis Cluster topology refresh (a few
// seconds after one, up to a second before one asked for after an error),
// which end by themselves after the client is closed.
//
// With SLUICE_TEST_MAIN=1, the test binary is sluice itself: its
// arguments go to main, as a built sluice's do, so that a test can run
// sluice as a process of its own (startProcess) without building it.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}
