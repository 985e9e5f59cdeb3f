package regions

import (
	"testing"
	"time"
)

// TestHungPeerReadGivenUp: a peer's read hangs past its deadline (a Site
// that ignores it; every round would find the read in flight). Twice
// MaxPeerTimeout after it began, it is given up on and the peer read
// anew: live again while the hung read still hangs.
func TestHungPeerReadGivenUp(t *testing.T) {
	w := newWorld(t, 2, 1, func(c *Config) { c.PeerTimeout, c.MaxPeerTimeout = 5*time.Millisecond, 10*time.Millisecond })
	warm(w)
	l := w.links[0][1]
	l.hang.Store(true)
	w.clock.Advance(100 * time.Millisecond)
	w.sync() // region 0's read of region 1 hangs
	l.hang.Store(false)
	defer l.release() // the hung read returns at the end
	n := w.nodes[0][0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		w.clock.Advance(100 * time.Millisecond)
		w.sync()
		st := n.Status()
		if st.Peers[0].State == Live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("region 1 %v 10s after region 0's read of it hung (%v): a read that never returns keeps the peer unread", st.Peers[0].State, st.Peers[0].Err)
		}
	}
	if h := n.clocks[0].hung.Load(); h != 1 {
		t.Errorf("%d reads given up on, want the one that hangs", h)
	}
}
