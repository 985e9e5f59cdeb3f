package decide

import (
	"sync/atomic"
	"time"
)

// fallbacks counts the decisions the store did not make, by Mode, and says
// so in the log at most once a minute. It is safe for concurrent use.
type fallbacks struct {
	n      [MaxMode + 1]atomic.Uint64
	warned atomic.Int64               // µs since the Unix epoch of the last line; 0: none yet
	logged [MaxMode + 1]atomic.Uint64 // n as the last line logged it
}

// modeSays says in the log what a decision in each Mode other than
// ModeStore did.
var modeSays = [MaxMode + 1]string{
	ModeOpen:   "fail open admitted requests without their limits",
	ModeClosed: "fail closed denied requests",
	ModeLocal:  "decided locally, within this server's share of the limits",
	ModeSlow:   "denied requests the store did not answer in time",
}

// warnEvery is how often at most the Service says at Warn level that it
// decides without the store.
const warnEvery = time.Minute

// note counts a decision made in mode m, not ModeStore, and logs the
// counts since the last line when that was warnEvery ago or more (the
// first such decision is logged at once).
func (s *Service) note(m Mode) {
	f := &s.fallbacks
	f.n[m].Add(1)
	now := s.br.now().UnixMicro()
	last := f.warned.Load()
	if (last != 0 && now-last < warnEvery.Microseconds()) || !f.warned.CompareAndSwap(last, now) {
		return
	}
	attrs := make([]any, 0, 2*MaxMode+4)
	msg := "decided without the store:"
	sep := " "
	for mo := ModeOpen; mo <= MaxMode; mo++ {
		n := f.n[mo].Load()
		if d := n - f.logged[mo].Swap(n); d > 0 {
			attrs = append(attrs, mo.String(), d)
			msg += sep + modeSays[mo]
			sep = "; "
		}
	}
	if last != 0 {
		attrs = append(attrs, "since", time.Duration(now-last)*time.Microsecond)
	}
	attrs = append(attrs, "mode", s.Mode().String())
	s.log.Warn(msg, attrs...)
}

// FailDecisions returns how many decisions since New each Mode other than
// ModeStore made, indexed by Mode (ModeStore's count is 0): the requests the
// store did not decide, counted once each, in the Mode their Response
// reports.
func (s *Service) FailDecisions() [MaxMode + 1]uint64 {
	var c [MaxMode + 1]uint64
	for m := ModeOpen; m <= MaxMode; m++ {
		c[m] = s.fallbacks.n[m].Load()
	}
	return c
}
