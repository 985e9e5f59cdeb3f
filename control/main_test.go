package control_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every goroutine a Retriever or a rules database starts has ended
// once they are closed, but for the two that rueidis's cluster client
// ends by itself after Close (a delayed topology refresh that sleeps up to
// five seconds first), which the other packages on a Redis Cluster allow too.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}
