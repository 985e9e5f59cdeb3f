package regions

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestQuietKeyNotDenied: a key far under its limit (a request every
// 500ms, 0.1% of 100,000 a minute) is never denied, while one peer's link
// drops one round in 20 (a read that timed out), for 10 minutes of
// rounds. Before, a key not read in the peer's last round was charged the
// whole limit for it: its cap was full, and it was denied until a round
// read the peer again (bursts of denials on the servers with peers only).
func TestQuietKeyNotDenied(t *testing.T) {
	w := newWorld(t, 3, 1, nil)
	l := sluice.Limit{Rate: 100_000, Period: time.Minute}
	w.clock.Advance(time.Second)
	denied, asked := 0, 0
	for i := range 6000 { // 10 minutes of 100ms rounds
		w.clock.Advance(100 * time.Millisecond)
		w.links[0][1].cut.Store(i%20 == 6)
		w.sync()
		if i%5 == 0 {
			asked++
			if !w.take(0, 0, "quiet", l, 1).Allowed {
				denied++
			}
		}
	}
	if denied > 0 {
		t.Errorf("%d of %d requests of a quiet key denied", denied, asked)
	}
}
