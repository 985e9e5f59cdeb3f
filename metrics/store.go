package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Reasons, as the reason label of sluice_store_errors_total writes them.
const (
	reasonTimeout  = "timeout"  // the context's deadline passed
	reasonCanceled = "canceled" // the caller gave up
	reasonOOM      = "oom"      // the store is full (sluice.ErrStoreFull: Redis at maxmemory)
	reasonError    = "error"    // anything else: refused, reset, a script error
)

// Observe implements decide.Observer: it counts r's decision (resp) by
// domain, descriptor and result, or r as invalid when err is not nil.
func (m *Metrics) Observe(_ context.Context, r *decide.Request, resp *decide.Response, err error) {
	if err != nil || resp == nil {
		m.invalid.Inc()
		return
	}
	m.observe(r, resp)
}

var _ decide.Observer = (*Metrics)(nil)

// WatchMode makes sluice_mode report mode (decide.Service's Mode) at
// each scrape; until it is called, sluice_mode is not exported.
func (m *Metrics) WatchMode(mode func() decide.Mode) { m.mode.src.Store(&mode) }

// StartCall is the first half of a store/stack Watcher: it returns ctx.
func (m *Metrics) StartCall(ctx context.Context, _ []sluice.Request) context.Context { return ctx }

// EndCall is the second half of a store/stack Watcher: it records a call
// of the store in sluice_store_duration_seconds and its error, if any, in
// sluice_store_errors_total.
func (m *Metrics) EndCall(_ context.Context, _ []sluice.Request, took time.Duration, err error) {
	m.takeAll.Observe(took.Seconds())
	m.storeError(err)
}

// storeError counts err, if any, by its reason.
func (m *Metrics) storeError(err error) {
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		m.timeouts.Inc()
	case errors.Is(err, context.Canceled):
		m.cancels.Inc()
	case errors.Is(err, sluice.ErrStoreFull):
		m.ooms.Inc()
	default:
		m.errs.Inc()
	}
}
