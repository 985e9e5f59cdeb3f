package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if any goroutine outlives them: every server,
// watcher, store and client a test starts must be stopped. The one
// exception is rueidis's own pause of a few seconds after a Redis Cluster
// topology refresh, which ends by itself after the client is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
