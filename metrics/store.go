package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Reasons, as the reason label of sluice_store_errors_total writes them.
const (
	reasonTimeout  = "timeout"  // the context's deadline passed
	reasonCanceled = "canceled" // the caller gave up
	reasonError    = "error"    // anything else: refused, reset, a script error
)

// Store decorates a sluice.Store with sluice_store_duration_seconds and
// sluice_store_errors_total. It is safe for concurrent use as its store is.
type Store struct {
	next    sluice.Store
	m       *Metrics
	take    prometheus.Observer
	takeAll prometheus.Observer
}

var _ sluice.Store = (*Store)(nil)

// Store returns next measured: give the result to decide.Config.Store.
func (m *Metrics) Store(next sluice.Store) *Store {
	return &Store{
		next:    next,
		m:       m,
		take:    m.storeDuration.WithLabelValues("take"),
		takeAll: m.storeDuration.WithLabelValues("take_all"),
	}
}

// TakeAll implements sluice.Store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	t := time.Now()
	err := s.next.TakeAll(ctx, reqs, ds)
	s.takeAll.Observe(time.Since(t).Seconds())
	s.m.storeError(err)
	return err
}

// NonBlocking reports whether the decorated store never blocks (see
// decide.NonBlocking), so that decorating a store keeps that promise.
func (s *Store) NonBlocking() bool {
	nb, ok := s.next.(decide.NonBlocking)
	return ok && nb.NonBlocking()
}

var _ decide.NonBlocking = (*Store)(nil)

// Ready reports whether the decorated store can decide (see decide.Ready);
// a store without Ready always can.
func (s *Store) Ready() bool {
	r, ok := s.next.(decide.Ready)
	return !ok || r.Ready()
}

var _ decide.Ready = (*Store)(nil)

// CheckLimit passes on the decorated store's veto on limits (see
// sluice.LimitChecker); a store without one applies every valid limit.
func (s *Store) CheckLimit(l sluice.Limit) error {
	if lc, ok := s.next.(sluice.LimitChecker); ok {
		return lc.CheckLimit(l)
	}
	return nil
}

var _ sluice.LimitChecker = (*Store)(nil)

// storeError counts err, if any, by its reason.
func (m *Metrics) storeError(err error) {
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		m.timeouts.Inc()
	case errors.Is(err, context.Canceled):
		m.cancels.Inc()
	default:
		m.errs.Inc()
	}
}
