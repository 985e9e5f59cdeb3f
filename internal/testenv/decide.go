package testenv

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// Decider returns the real decision service for the rules in rulesYAML over
// a memory store that runs on now (nil: the store's own clock), with
// admit's concurrency slots on now as the server composes them. The store
// is closed when the test ends.
func Decider(t testing.TB, rulesYAML string, now func() time.Time) *decide.Service {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	mc := memory.DefaultConfig()
	mc.Now = now
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ac := admit.DefaultConfig()
	ac.Now = now
	step, err := admit.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	dc := decide.DefaultConfig()
	dc.Rules, dc.Admit = func() *rules.Set { return set }, step
	dc.Store = st
	dc.Logger = slog.New(slog.DiscardHandler)
	s, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
