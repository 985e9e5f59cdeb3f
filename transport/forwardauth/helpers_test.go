package forwardauth_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// t0 is 10 s into a minute.
var t0 = time.Date(2026, 11, 21, 12, 0, 10, 0, time.UTC)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// service returns the real decision service over the memory store, its
// clock fixed at t0.
func service(t testing.TB, rulesYAML string) *decide.Service {
	clk := &clock{now: t0}
	return testenv.Decider(t, rulesYAML, clk.Now)
}
