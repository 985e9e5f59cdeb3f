package forwardauth_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// t0 is 10 s into a minute.
var t0 = time.Date(2026, 11, 21, 12, 0, 10, 0, time.UTC)

// service returns the real decision service over the memory store, its
// clock fixed at t0.
func service(t testing.TB, rulesYAML string) *decide.Service {
	clk := clocktest.New(t0)
	return testenv.Decider(t, rulesYAML, clk.Now)
}
