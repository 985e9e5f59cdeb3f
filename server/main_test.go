package server

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if any goroutine outlives them: every server,
// watcher, store and client a test starts must be stopped. The exceptions
// are rueidis's own pauses around a Redis Cluster topology refresh (a few
// seconds after one, up to a second before one asked for after an error),
// which end by themselves after the client is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}
