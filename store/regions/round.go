package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// PeerState is how the last round found a peer region.
type PeerState uint8

// The states of a peer.
const (
	// Live: read in the last round, with live nodes that echo this node.
	Live PeerState = iota
	// Unechoed: read, but one of its nodes has not echoed this node for
	// Config.EchoRounds rounds (it does not read this region): this node
	// is cut off from it.
	Unechoed
	// Dead: read, with no live node: its counts count, it takes no share.
	Dead
	// Unreachable: not read in the last round (an error or
	// Config.PeerTimeout): cut off.
	Unreachable
	// Unknown: read, but sluice has never kept a board there: as dead
	// (nothing runs there), unless it runs with another key prefix, which
	// no region can see.
	Unknown
	// Mismatch: read, but its nodes list other regions than this node:
	// they may not read this region at all, so it is charged the whole
	// limit until the configurations agree.
	Mismatch
	// Refused: its reply was refused (ErrRefused: over its bounds in
	// bytes, malformed, or counts that do not match the keys asked): cut
	// off for the round, and charged as an unreachable one.
	Refused
	// Lagging: live and read, but slowly (its read took longer than
	// Config.PeerTimeout): the rounds wait for it, up to its timeout,
	// which follows its round trip (see Config.MaxPeerTimeout). Not cut
	// off.
	Lagging
)

var peerStateNames = [...]string{Live: "live", Unechoed: "unechoed", Lagging: "lagging", Dead: "dead", Unreachable: "unreachable",
	Unknown: "unknown", Mismatch: "mismatch", Refused: "refused"}

// String returns the state's name, such as "unreachable".
func (p PeerState) String() string {
	if int(p) < len(peerStateNames) {
		return peerStateNames[p]
	}
	return fmt.Sprintf("PeerState(%d)", p)
}

// peerState is what rounds keep of a peer.
type peerState struct {
	name   string
	state  PeerState
	nodes  int       // live nodes when last read
	lastOK time.Time // the start of the last round that read it
	// bounded: since that read, this node's record stayed on its board
	// (beats less than NodeLife/2 apart), so the peer, reading it, could
	// grant at most EchoRounds+2 rounds unseen. Otherwise its growth since
	// is unbounded: it is charged the whole limit.
	bounded bool
	okHome  int64         // the home clock when that read was over, µs
	took    time.Duration // how long that read took
	timeout time.Duration // how long the last round waited for it at most
	err     error         // the last read's error, until one succeeds
	errors  uint64        // reads that failed
	board   boardSeen
	born    int64 // its board's incarnation's birth as last read (Reading.Born)
	// unsettled: its last reading that answered may miss what its earlier
	// incarnations counted (Store.unsettled).
	unsettled bool
}

// boardSeen is what rounds keep of a site's board across its readings,
// to tell one that may miss what earlier incarnations counted (see
// Store.unsettled).
type boardSeen struct {
	known bool      // the last reading that answered found a board
	lost  time.Time // the start of the round that first found none after one did; zero otherwise
}

// roundState is what rounds keep between them; Store.roundMu guards it.
type roundState struct {
	seq       uint64
	seen      map[string]uint64 // the echo the next beat writes
	peers     []peerState
	lastStart int64 // µs on Config.Now
	lastBeat  time.Time
	// beatSince is the home clock (µs) since which this node's record has
	// stayed on its board (its beats less than NodeLife/2 apart); 0
	// before its first beat, or after a gap.
	beatSince int64
	rounds    uint64
	failed    uint64
	cutRounds uint64
	// inc is the home incarnation this node carried what it knows into
	// (Site.Carry), which its record states (Node.Inc); home is what
	// rounds keep of the home board.
	inc      string
	home     boardSeen
	homeBorn int64 // the home board's incarnation's birth as last read (Reading.Born)
	// homeUnsettled: the last home reading may miss what the home site's
	// earlier incarnations counted (Store.unsettled).
	homeUnsettled bool
}

// facts are what a round found about the regions, for every key's cap.
type facts struct {
	regions int64  // R: this region and each peer alive or cut off
	cut     bool   // cut off from some peer
	fresh   []bool // per peer: its counts were read this round, and count as read
	// unsettled, per peer, and homeUnsettled: the reading may miss what
	// the site's earlier incarnations counted (see Store.unsettled): its
	// keys are charged the whole limit
	unsettled     []bool
	homeUnsettled bool
	homeWant      []bool  // the keys whose carried counts the home read asked for
	slop          []int64 // per peer not fresh: how many grants it may have made unseen (× α), or -1: any
	peers         []*peerState
	now           int64  // the home clock when it read, µs
	since         int64  // roundState.beatSince
	inc           string // the home Redis's incarnation
	start         time.Time
}

// round runs one round; see Sync.
func (s *Store) round(ctx context.Context) error {
	p, err := s.begin(ctx)
	if err != nil {
		return err
	}
	return s.finish(ctx, p)
}

// pending is a round between its home read and its peers' reads.
type pending struct {
	keys     []*entry
	reqs     []sluice.Request
	home     Reading
	want     []bool // the keys whose carried counts the home read asked for
	start    time.Time
	beatErr  error
	carryErr error
}

// begin starts a round: it beats and reads the home counts of the keys in
// use. Every peer is read after it returns, which the bound rests on.
func (s *Store) begin(ctx context.Context) (*pending, error) {
	rs := &s.rs
	rs.seq++
	rs.rounds++
	p := &pending{start: s.cfg.Now()}
	// a key asked for within a cap's life is read every round, so that what
	// a peer's last reading says of it is of that round: charged from it
	// (plus the slop) when the peer is not read, not the whole limit
	since := min(rs.lastStart, p.start.Add(-s.cfg.CapLife).UnixMicro())
	p.keys = s.tab.active(since, p.start.Add(-s.idle()).UnixMicro(), p.start.UnixMicro()+s.offset.Load())
	rs.lastStart = p.start.UnixMicro()
	p.reqs = make([]sluice.Request, len(p.keys))
	for i, e := range p.keys {
		p.reqs[i] = e.req
	}
	me := Node{Region: s.cfg.Region, ID: s.cfg.Node, Seq: rs.seq, Regions: s.names, Seen: rs.seen, Inc: rs.inc}
	beat := make(chan error, 1)
	go func() { beat <- s.cfg.Home.Beat(ctx, me, s.cfg.NodeLife) }()
	p.want = wantCarried(p.reqs, rs.homeBorn, p.start.UnixMicro()+s.offset.Load())
	home, err := s.cfg.Home.Read(ctx, p.reqs, p.want)
	read := s.cfg.Now()
	p.beatErr = <-beat
	if p.beatErr == nil {
		if !rs.lastBeat.IsZero() && p.start.Sub(rs.lastBeat) >= s.cfg.NodeLife/2 {
			for i := range rs.peers {
				rs.peers[i].bounded = false
			}
			rs.beatSince = 0
		}
		rs.lastBeat = p.start
	}
	if err == nil && len(home.Counts) != len(p.reqs) {
		err = fmt.Errorf("%d counts for %d keys", len(home.Counts), len(p.reqs))
	}
	if err != nil {
		// a Redis that fails may come back empty, and a cap is on the
		// count it held: a key waits for the next round's cap, decided
		// meanwhile as a key never seen
		s.tab.dropGrants()
		s.publishFailed()
		return nil, fmt.Errorf("regions: read home: %w", err)
	}
	p.home = home
	rs.homeBorn = home.Born
	if rs.inc != "" && home.Incarnation != rs.inc || !home.Known && rs.home.known {
		// the Redis restarted empty since the last home read (a new
		// incarnation, or a board gone) without a read failing: the caps
		// are on the count it held, dropped as a failed read drops them
		// before this round's land
		s.tab.dropGrants()
	}
	if home.Incarnation != "" && home.Incarnation != rs.inc {
		// the home Redis is new (or this node is): what this node knows of
		// its earlier incarnations goes where every reader finds it, before
		// its record says so (the next beat) and before its peers are read
		if p.carryErr = s.carry(ctx, home); p.carryErr == nil {
			rs.inc = home.Incarnation
		}
	}
	if p.beatErr == nil && rs.beatSince == 0 {
		rs.beatSince = home.Now
	}
	s.offset.Store(home.Now - p.start.Add(read.Sub(p.start)/2).UnixMicro())
	s.margin.Store(max(read.Sub(p.start), time.Millisecond).Microseconds())
	return p, nil
}

// finish ends a round begun by begin: it reads every peer and sets the
// caps.
func (s *Store) finish(ctx context.Context, p *pending) error {
	reads := s.readPeers(ctx, p.reqs)
	f := s.account(reads, p.start, s.cfg.Now().UnixMicro()+s.offset.Load())
	f.now, f.inc, f.since = p.home.Now, p.home.Incarnation, s.rs.beatSince
	f.homeUnsettled, f.homeWant = s.unsettled(p.home, &s.rs.home, p.start), p.want
	s.rs.homeUnsettled = f.homeUnsettled
	s.regions.Store(f.regions)
	for i, e := range p.keys {
		g := s.grantFor(e, i, p.home, reads, f)
		e.grant.Store(g)
		e.prev.Store(g)
	}
	end := s.cfg.Now()
	s.next.Store(end.Add(max(s.cfg.SyncInterval, end.Sub(p.start))).UnixMicro())
	s.publish(f.cut, p.beatErr != nil, end)
	if p.beatErr != nil {
		return fmt.Errorf("regions: beat: %w", p.beatErr)
	}
	if p.carryErr != nil {
		return fmt.Errorf("regions: carry: %w", p.carryErr)
	}
	return nil
}

// carry writes on the home site what this node knows its earlier
// incarnations counted of each key in the window home's clock is in (a
// key's count of an incarnation before home's, or the base of one already
// read in it), idle keys included: the counts a restart without
// persistence lost, which the node's peers, and the other nodes of its
// region, may never have read. roundMu is held.
func (s *Store) carry(ctx context.Context, home Reading) error {
	var cs []Carried
	s.tab.each(func(e *entry) {
		k, l := &e.own, e.req.Limit
		p := l.Period.Microseconds()
		w := windowStart(home.Now, p)
		if !k.ok || k.inc == "" || k.window != w {
			return
		}
		c := k.count
		if k.inc == home.Incarnation {
			c = k.base
		}
		if c <= 0 {
			return
		}
		until := w + p
		if l.Algorithm == sluice.SlidingWindow {
			until += p
		}
		cs = append(cs, Carried{Key: e.req.Key, Window: w, Count: c, Until: until})
	})
	if len(cs) == 0 {
		return nil
	}
	return s.cfg.Home.Carry(ctx, cs)
}

// boardGrace is how long a board found gone after it was found is waited
// for: NodeLife (a node whose record expired is gone, and what it knew
// with it), plus the longest a round of a live node takes before the one
// that beats the board again begins (MaxPeerTimeout + SyncInterval).
func (s *Store) boardGrace() time.Duration {
	return s.cfg.NodeLife + s.cfg.MaxPeerTimeout + max(s.cfg.SyncInterval, 0)
}

// unsettled reports whether r, a reading of a site whose board b tells
// what rounds saw before, may miss what the site's earlier incarnations
// counted: a live node's record (this node's aside) says it has not
// carried what it knows into the board's incarnation, or the board is
// gone (a Redis back empty, before any beat) within boardGrace of the
// round that first found it gone after a reading found it: a region with
// a live node beats a board again within a round, one without has
// nothing to carry. Such a reading's keys are charged the whole limit:
// no reader that never read a key, nor one whose reading of it is old,
// takes the emptied count for the region's, until every live node has
// carried.
// roundMu is held.
func (s *Store) unsettled(r Reading, b *boardSeen, start time.Time) bool {
	if !r.Known {
		if b.known {
			b.known, b.lost = false, start
		}
		return !b.lost.IsZero() && start.Sub(b.lost) < s.boardGrace()
	}
	b.known, b.lost = true, time.Time{}
	for _, n := range r.Nodes {
		if n.ID != s.cfg.Node && n.Inc != "" && n.Inc != r.Incarnation {
			return true
		}
	}
	return false
}

// idle is how long a key unasked stays in the table.
func (s *Store) idle() time.Duration {
	return max(10*s.cfg.SyncInterval, 2*s.cfg.CapLife)
}

// peerRead is one peer's reading in a round.
type peerRead struct {
	Reading
	err  error
	took time.Duration // how long the read took
	want []bool        // the keys whose carried counts it asked for
}

// peerClock is what a Store keeps of a peer's reads across rounds: at
// most one read in flight, which goes on in the background up to
// Config.MaxPeerTimeout after a round stopped waiting for it, so that a
// slow peer's round trip is measured; and that measure, which sets how
// long a round waits for the peer (timeout). A read still in flight twice
// that long after it began is given up on (a Site that does not honour
// its context's deadline): the next round reads the peer anew, and the
// read given up on, when it returns, changes nothing. At most maxHung
// such reads a peer are left running; then the peer waits for one of
// them.
type peerClock struct {
	flying atomic.Int64 // UnixNano when the read in flight began; 0: none
	hung   atomic.Int32 // reads given up on that have not returned
	took   atomic.Int64 // ns: a moving average of the reads that answered; 0 before one
}

// maxHung is how many reads of a peer given up on may be left running.
const maxHung = 4

// begin starts a read of the peer at now, and reports false when one is
// in flight that is not given up on.
func (c *peerClock) begin(now time.Time, giveUp time.Duration) bool {
	f := c.flying.Load()
	if f != 0 {
		if now.Sub(time.Unix(0, f)) < giveUp || c.hung.Load() >= maxHung || !c.flying.CompareAndSwap(f, 0) {
			return false
		}
		c.hung.Add(1)
	}
	return c.flying.CompareAndSwap(0, now.UnixNano())
}

// end ends the read begun at began, and reports whether it was still the
// peer's read in flight (not given up on).
func (c *peerClock) end(began time.Time) bool {
	if c.flying.CompareAndSwap(began.UnixNano(), 0) {
		return true
	}
	c.hung.Add(-1)
	return false
}

// observe adds a read that answered after d to the average.
func (c *peerClock) observe(d time.Duration) {
	old := c.took.Load()
	if old == 0 {
		c.took.Store(int64(d))
		return
	}
	c.took.Store(old - old/4 + int64(d)/4)
}

// timeout returns how long a round waits for the peer: three times its
// reads' average, within [Config.PeerTimeout, Config.MaxPeerTimeout].
func (s *Store) timeout(c *peerClock) time.Duration {
	return min(max(3*time.Duration(c.took.Load()), s.cfg.PeerTimeout), s.cfg.MaxPeerTimeout)
}

// readPeers reads every peer at once, and waits for each up to its
// timeout. A peer whose read of an earlier round is still in flight is
// not read again: it is not read this round (unless that read is given
// up on, see peerClock).
func (s *Store) readPeers(ctx context.Context, reqs []sluice.Request) []peerRead {
	out := make([]peerRead, len(s.cfg.Peers))
	chans := make([]chan peerRead, len(s.cfg.Peers))
	start := time.Now()
	now := s.cfg.Now().UnixMicro() + s.offset.Load()
	for i, p := range s.cfg.Peers {
		c := &s.clocks[i]
		want := wantCarried(reqs, s.rs.peers[i].born, now)
		out[i].want = want
		t := time.Now()
		if !c.begin(t, 2*s.cfg.MaxPeerTimeout) {
			out[i].err = fmt.Errorf("its read of an earlier round has not answered in %v", s.timeout(c))
			continue
		}
		chans[i] = make(chan peerRead, 1)
		s.reads.Add(1)
		go func() {
			defer s.reads.Done()
			pctx, cancel := context.WithTimeout(s.bg, s.cfg.MaxPeerTimeout)
			r, err := p.Site.Read(pctx, reqs, want)
			cancel()
			took := time.Since(t)
			if err == nil && len(r.Counts) != len(reqs) {
				err = fmt.Errorf("%w: %d counts for %d keys", ErrRefused, len(r.Counts), len(reqs))
			}
			if c.end(t) && err == nil {
				c.observe(took)
			}
			chans[i] <- peerRead{r, err, took, want}
		}()
	}
	for i, ch := range chans {
		if ch == nil {
			continue
		}
		wait := s.timeout(&s.clocks[i])
		t := time.NewTimer(max(wait-time.Since(start), 0))
		select {
		case out[i] = <-ch:
		case <-t.C:
			out[i].err = fmt.Errorf("no answer within %v", wait)
		case <-ctx.Done():
			out[i].err = ctx.Err()
		}
		t.Stop()
	}
	return out
}

// account updates what rounds keep of each peer from its reading, and
// returns the round's facts: which peers count as read, whether this node
// is cut off, and how many regions there are.
func (s *Store) account(reads []peerRead, start time.Time, readHome int64) facts {
	rs := &s.rs
	f := facts{regions: 1, fresh: make([]bool, len(reads)), unsettled: make([]bool, len(reads)), slop: make([]int64, len(reads)),
		start: start}
	seen := make(map[string]uint64)
	for i, r := range reads {
		ps := &rs.peers[i]
		ps.timeout = s.timeout(&s.clocks[i])
		if r.err == nil {
			ps.lastOK, ps.err, ps.bounded, ps.okHome, ps.took = start, nil, true, readHome, r.took
			ps.state = s.judge(r.Reading, seen)
			f.unsettled[i] = s.unsettled(r.Reading, &ps.board, start)
			ps.unsettled = f.unsettled[i]
			ps.born = r.Born
			if ps.state == Live && r.took > s.cfg.PeerTimeout {
				ps.state = Lagging
			}
		} else {
			ps.state, ps.err = Unreachable, r.err
			if errors.Is(r.err, ErrRefused) {
				ps.state = Refused
			}
			ps.errors++
		}
		switch ps.state {
		case Live, Lagging, Unechoed:
			ps.nodes = len(r.Nodes)
			f.fresh[i] = true
		case Dead, Unknown:
			f.fresh[i] = true
			continue // no live node there: it takes no share
		}
		f.regions++
		if ps.state != Live && ps.state != Lagging {
			f.cut = true
		}
		switch {
		case f.fresh[i]:
		case ps.bounded && ps.state == Unreachable:
			f.slop[i] = int64(max(ps.nodes, 1)) * int64(s.cfg.EchoRounds+2)
		default: // a mismatch, whose nodes may not read us at all, or a read too old to bound it
			f.slop[i] = -1
		}
	}
	rs.seen = seen
	for i := range rs.peers {
		f.peers = append(f.peers, &rs.peers[i])
	}
	return f
}

// judge returns the state of a peer read without error, and adds the
// rounds of its nodes to seen, the echo of the next beat.
func (s *Store) judge(r Reading, seen map[string]uint64) PeerState {
	if !r.Known {
		return Unknown
	}
	if len(r.Nodes) == 0 {
		return Dead
	}
	state := Live
	for _, n := range r.Nodes {
		seen[n.ID] = n.Seq
		if !slices.Equal(n.Regions, s.names) {
			state = Mismatch
		}
		if e, ok := n.Seen[s.cfg.Node]; state == Live && (!ok || e > s.rs.seq || s.rs.seq-e > s.cfg.EchoRounds) {
			state = Unechoed
		}
	}
	return state
}

// grantFor returns the cap of e, the key of index i in the round's
// readings, whose count the home site read as read. A fixed_window's
// count of a window never falls: if the home Redis lost some (a restart
// without persistence, a failover), the view keeps what it knew, and the
// cap, on the count as it now is, gives only the room the view leaves.
//
// A reading that may miss what its site's earlier incarnations counted
// (facts.unsettled) is charged the whole limit; what they carried is
// added to a count read from a new incarnation (known.update).
func (s *Store) grantFor(e *entry, i int, home Reading, reads []peerRead, f facts) *grant {
	read := home.Counts[i]
	l := e.req.Limit
	p := l.Period.Microseconds()
	w := windowStart(f.now, p)
	sliding := l.Algorithm == sluice.SlidingWindow
	alpha := share(l.Rate, f.regions, s.cfg.Share)
	rho := ceilDiv(l.Rate, int64(len(s.names)))
	g := &grant{window: w, at: f.start, cut: f.cut, counts: make([]int64, 1+len(reads)), charge: make([]int64, 1+len(reads))}
	// the cap below stays on read, Redis's count
	e.own.update(clampCount(read, l.Rate), carriedOf(home, i, l.Rate), w, w, f.inc, sliding, f.start)
	own, ownCharge := e.own.count, e.own.count
	if f.homeUnsettled || missed(f.homeWant, i, home, l) {
		ownCharge = l.Rate
	}
	g.counts[0], g.charge[0] = own, ownCharge
	view := ownCharge
	for j, r := range reads {
		k := &e.last[j]
		if f.fresh[j] {
			k.update(clampCount(r.Counts[i], l.Rate), carriedOf(r.Reading, i, l.Rate), windowStart(r.Now, p), w, r.Incarnation,
				sliding, f.start)
			c := k.count
			if f.unsettled[j] || missed(r.want, i, r.Reading, l) {
				c = l.Rate
			}
			view += c
			g.counts[1+j], g.charge[1+j] = k.count, c
			continue
		}
		if k.ok && (sliding || k.window == w) {
			g.counts[1+j] = k.count
		}
		g.charge[1+j] = s.charge(k, f.peers[j], f.slop[j], w, f.since, l, alpha, rho)
		view += g.charge[1+j]
	}
	g.full, g.others = view >= l.Rate, view-ownCharge
	var room int64
	if !g.full {
		room = share(l.Rate-view, f.regions, s.cfg.Share)
	}
	if f.cut {
		room = min(room, max(rho-own, 0))
	}
	g.cap = read + room
	return g
}

// update sets k from a count c, read of the Redis incarnation inc (""
// when unknown) beside cr, what its region's nodes carried of the earlier
// ones, in the window that holds the reader's clock there, pw, for the
// window w of the home clock. Counts of one window only grow, so a lower
// one keeps the higher; a new incarnation (the Redis lost its data: a
// restart without persistence) counts from zero again, so what the
// earlier ones counted in the window is added to it: what k knew of them,
// or what was carried of them in pw, whichever is more. Both are at most
// what they counted, and neither is in c, so nothing is counted twice.
func (k *known) update(c int64, cr Carried, pw, w int64, inc string, sliding bool, at time.Time) {
	if !k.ok || k.window != w {
		*k = known{window: w, inc: k.inc}
	}
	if inc == "" && k.inc != "" {
		// a board gone: a Redis back empty that no node has beaten yet, an
		// incarnation without a name, whose count the next one's would
		// count again; the reading is charged the whole limit meanwhile
		// (Store.unsettled)
		return
	}
	if inc != "" && k.inc != "" && inc != k.inc {
		k.base = k.count
	}
	if cr.Window == pw && cr.Count > k.base {
		k.base = cr.Count
	}
	if inc != "" {
		k.inc = inc
	}
	k.at, k.ok = at, true
	switch {
	case sliding: // a weighted count, which falls as the window slides
		k.count = k.base + c
	case pw == w:
		k.count = max(k.count, k.base+c)
	case pw > w: // the reader's clock is past our window: its count there is what we knew
	default: // the reader's clock is before our window: nothing in it yet
	}
}

// charge returns what a key's view counts for a peer not read this round:
// the most it may have reached. While its last read bounds it (see
// peerState.bounded), that is max(last + slop × α, ρ): it grew by at most
// slop grants before it learned of the cut, then held to its share; for a
// fixed_window whose window began after that read, the peer had nothing
// in it then. A peer never read is charged its share ρ in a window
// that began (with a sliding_window's previous one) after this node's
// record was on its board, by every clock (since, µs): each of the
// peer's nodes that reads the record finds no echo of itself and is cut
// off, one that cannot read it is cut off too, and a cut-off region
// holds to ρ; before that window, the whole limit. Otherwise, the whole
// limit.
func (s *Store) charge(k *known, ps *peerState, slop, w, since int64, l sluice.Limit, alpha, rho int64) int64 {
	if ps.lastOK.IsZero() && ps.state != Mismatch {
		start := w
		if l.Algorithm == sluice.SlidingWindow {
			start -= l.Period.Microseconds()
		}
		if since > 0 && start > since+maxSkew.Microseconds() {
			return rho
		}
		return l.Rate
	}
	if slop < 0 {
		return l.Rate
	}
	switch {
	case k.ok && k.at.Equal(ps.lastOK) && (l.Algorithm == sluice.SlidingWindow || k.window == w):
		return max(k.count+slop*alpha, rho)
	case l.Algorithm == sluice.FixedWindow && w > ps.okHome+maxSkew.Microseconds():
		return max(slop*alpha, rho)
	}
	return l.Rate
}

// wantCarried returns which of reqs a read of a site asks what was
// carried of: those whose window (with a sliding_window's previous one)
// may have begun before its incarnation's birth as last read, born (0:
// unknown, every one), now being the home clock (µs), within twice the
// clocks' skew. Once the windows of a key began after it, a read asks
// none: no bytes across the WAN for it.
func wantCarried(reqs []sluice.Request, born, now int64) []bool {
	want := make([]bool, len(reqs))
	for i, r := range reqs {
		want[i] = carryMatters(r.Limit, born, now, 2*maxSkew.Microseconds())
	}
	return want
}

// carryMatters reports whether what an incarnation born at born (µs; 0:
// unknown) carried may count in l's window at now (with a
// sliding_window's previous one), the clocks' skew apart.
func carryMatters(l sluice.Limit, born, now, skew int64) bool {
	if born == 0 {
		return true
	}
	p := l.Period.Microseconds()
	start := windowStart(now, p)
	if l.Algorithm == sluice.SlidingWindow {
		start -= p
	}
	return start <= born+skew
}

// missed reports whether r's i-th key was not asked what was carried of
// it (want) though it may count (r's incarnation is newer than the one
// the read was asked by): the reading is then charged the whole limit
// for it, and the next asks.
func missed(want []bool, i int, r Reading, l sluice.Limit) bool {
	if asked(want, i) {
		return false
	}
	return carryMatters(l, r.Born, r.Now, maxSkew.Microseconds())
}

// carriedOf returns what r carried of its i-th key, its count clamped as
// a count read (clampCount); a zero Carried when r has none.
func carriedOf(r Reading, i int, rate int64) Carried {
	if i >= len(r.Carried) {
		return Carried{}
	}
	cr := r.Carried[i]
	cr.Count = clampCount(cr.Count, rate)
	return cr
}

// clampCount returns a region's count c of a limit of rate, as its Redis
// reported it, within what a window allows: never negative, never past
// the rate (no region's cap ever is), so that no count read, a peer's
// above all, moves a view by more than the limit.
func clampCount(c, rate int64) int64 { return min(max(c, 0), rate) }

// maxSkew is how far apart the regions' clocks may be for a fixed_window
// to start after a peer was last read by every clock.
const maxSkew = time.Second

// share returns max(⌊left / (regions × k)⌋, 1): what a round gives a
// region of left.
func share(left, regions, k int64) int64 {
	return max(left/(regions*k), 1)
}

// windowStart returns the start of the period-long window, aligned to the
// Unix epoch, that holds now (µs).
func windowStart(now, period int64) int64 {
	m := now % period
	if m < 0 {
		m += period
	}
	return now - m
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// use is the cap a request is decided against.
type use struct {
	cap int64
	g   *grant // nil when decided as a key never seen
}

// request returns r as the wrapped store decides it: the region's count
// under the cap. A cap of 0 becomes a request of more than its rate,
// which no store admits and which counts nothing.
func (u use) request(r sluice.Request) sluice.Request {
	out := r
	if u.cap >= 1 {
		out.Limit.Rate = u.cap
		return out
	}
	out.Limit.Rate = 1
	if r.Cost > 0 {
		out.Cost = 2
	}
	return out
}

// capFor returns the cap r is decided against at now: its key's cap if
// a round set one that still holds, else the share of a key never seen
// (which asks for a round at once), less what the last round counted of
// the region's own in the window.
func (s *Store) capFor(r sluice.Request, now time.Time) use {
	e := s.tab.get(r)
	if e == nil {
		return use{cap: s.unseen(r.Limit)}
	}
	e.seen.Store(now.UnixMicro())
	if g := e.grant.Load(); g != nil && s.holds(g, r.Limit, now) {
		return use{cap: g.cap, g: g}
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	s.unseenN.Add(1)
	c := s.unseen(r.Limit)
	if g := e.prev.Load(); g != nil {
		// what the region had counted in this window by the last round may
		// be gone from its count: a Redis back empty, whose failure dropped
		// the caps (a count that did not fall is counted twice here: less
		// is admitted until a round caps the key, never more)
		p := r.Limit.Period.Microseconds()
		if g.window == windowStart(now.UnixMicro()+s.offset.Load(), p) {
			c = max(c-g.counts[0], 0)
		}
	}
	return use{cap: c}
}

// unseen returns the cap of a key without one: max(⌊L / (R × k)⌋, 1) of
// the region's whole count, which is what one round could give a region
// that has nothing yet; a region past it waits for its first round.
func (s *Store) unseen(l sluice.Limit) int64 {
	return min(share(l.Rate, s.regions.Load(), s.cfg.Share), ceilDiv(l.Rate, int64(len(s.names))))
}

// holds reports whether g still caps requests at now. A sliding_window's
// cap holds for Config.CapLife after its round began: its weighted count
// falls as the window slides, so an older cap gives back more (the bound
// counts CapLife). A fixed_window's (a bucket's count's too) holds for
// fixedCapLife, if made for the window the home clock is in, not within
// the clock's margin of its edges: its bound does not count when a cap is
// used, and fixedCapLife outlives two rounds that each wait for a lagging
// peer as long as a round may (Config.MaxPeerTimeout), so that such
// rounds leave no gap between a key's caps.
func (s *Store) holds(g *grant, l sluice.Limit, now time.Time) bool {
	if l.Algorithm != sluice.FixedWindow {
		return now.Sub(g.at) <= s.cfg.CapLife
	}
	if now.Sub(g.at) > s.fixedCapLife() {
		return false
	}
	est, margin, p := now.UnixMicro()+s.offset.Load(), s.margin.Load(), l.Period.Microseconds()
	return est-g.window >= margin && g.window+p-est >= margin
}

// fixedCapLife is how long a fixed_window's cap holds after its round
// began: Config.CapLife, or, if longer, 2 × (MaxPeerTimeout +
// SyncInterval), what two rounds that wait for a lagging peer take at
// most (4.2s by default).
func (s *Store) fixedCapLife() time.Duration {
	return max(s.cfg.CapLife, 2*(s.cfg.MaxPeerTimeout+max(s.cfg.SyncInterval, 0)))
}

// decision returns the decision of r from d, the wrapped store's on the
// region's count under u's cap: of the limit itself, and when it denies,
// retrying when a round may give more, or when the window frees what
// every region took.
func (s *Store) decision(r sluice.Request, u use, d sluice.Decision, now time.Time) sluice.Decision {
	l := r.Limit
	d.Limit = l.Capacity()
	if u.cap < 1 {
		d.Remaining = 0
	}
	if d.Allowed && u.g != nil && u.cap >= 1 {
		// the global room as this region sees it: the limit less what the
		// round counted for the others and the region's count now
		d.Remaining = max(min(l.Rate-u.g.others-(u.cap-d.Remaining), l.Rate), 0)
	}
	if d.Allowed || r.Cost == 0 {
		return d
	}
	if r.Cost > l.Rate {
		d.RetryAfter = sluice.Never
		return d
	}
	round := max(time.Duration(s.next.Load()-now.UnixMicro())*time.Microsecond, time.Millisecond)
	if u.g == nil || !u.g.full {
		if d.RetryAfter == sluice.Never || d.RetryAfter > round {
			d.RetryAfter = round
		}
		return d
	}
	if d.RetryAfter == sluice.Never {
		est := now.UnixMicro() + s.offset.Load()
		p := l.Period.Microseconds()
		d.RetryAfter = time.Duration(windowStart(est, p)+p-est) * time.Microsecond
	}
	return d
}
