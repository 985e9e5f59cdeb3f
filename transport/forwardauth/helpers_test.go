package forwardauth_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
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
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: t0}
	mc := memory.DefaultConfig()
	mc.Now = clk.Now
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = st
	dc.Logger = slog.New(slog.DiscardHandler)
	s, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
