package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests. Two of rueidis's
// own end by themselves after its client is closed, and are not ours: the
// cluster client closes the connections a topology refresh replaced five
// seconds later, and a refresh asked for after an error waits up to a
// second first (singleflight's DelayDo).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// t0 is a fixed instant in the middle of a minute, an hour and a day.
var t0 = time.Date(2026, 3, 14, 12, 30, 30, 0, time.UTC)

// fakeClock is the tests' fake clock, which they set by hand.
type fakeClock = clocktest.Clock

// backend is one kind of Redis deployment the tests run against.
type backend struct {
	name string
	url  func(t *testing.T) string
}

func backends() []backend {
	return []backend{
		{"single", func(t *testing.T) string { return "redis://" + testenv.RedisAddr(t) + "/0" }},
		{"cluster", func(t *testing.T) string {
			return "redis+cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ",")
		}},
	}
}

// testConfig returns a configuration whose keys are the test's own (a
// random prefix), with a margin long enough for fake clocks.
func testConfig(now func() time.Time) Config {
	cfg := DefaultConfig()
	cfg.KeyPrefix = fmt.Sprintf("sluicetest:%x:", rand.Uint64())
	cfg.Now = now
	cfg.ExpiryMargin = 10 * time.Minute
	cfg.DialTimeout, cfg.Timeout = hangBound, hangBound
	return cfg
}

// hangBound is the tests' DialTimeout (rueidis bounds connection
// handshakes by it, whatever the context allows) and Timeout (calls
// without a deadline): the defaults, 1s, failed Open ('load script:
// context deadline exceeded', 'dial tcp: i/o timeout') and calls on a
// loaded machine. It bounds only a hang; the tests of a dead or hung
// Redis do not wait on it (a killed one refuses at once, calls to a paused
// one end at their own deadline).
const hangBound = 10 * time.Second

// open opens a store closed when the test ends.
func open(t testing.TB, url string, cfg Config) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, url, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitFor waits until cond holds, checking it every 10ms, and fails the
// test with what if it does not within limit: tests wait on conditions,
// never for a fixed time.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, limit)
		case <-tick.C:
		}
	}
}
