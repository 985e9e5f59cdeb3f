package regions

import (
	"time"
)

// Status is what the node's last round found: for /readyz, metrics and
// the dashboard.
type Status struct {
	// Region is this node's region, Regions the number R its caps divide
	// by (itself and every peer alive or cut off).
	Region  string
	Regions int
	// Rounds counts the rounds run; Failed those whose home read or beat
	// failed. LastRound is when the last one began (zero before any).
	Rounds, Failed uint64
	LastRound      time.Time
	// Cut reports whether the last round found the node cut off from a
	// peer: its region then takes at most its share of a window. CutRounds
	// counts the rounds that did.
	Cut       bool
	CutRounds uint64
	// Unseen counts the decisions made without a cap: on a key no round
	// had read yet, or whose cap had expired (Config.CapLife) or belonged
	// to another window.
	Unseen uint64
	// Unsettled reports that the last round's reading of this region's
	// Redis may miss what its earlier incarnations counted (it came back
	// empty, and a live node has not carried what it knows into it yet):
	// the keys the round read are charged the whole limit for it.
	Unsettled bool
	// Peers are the other regions, as Config.Peers lists them.
	Peers []PeerStatus
}

// PeerStatus is what the last round found of a peer region.
type PeerStatus struct {
	Name  string
	State PeerState
	// Nodes is how many live nodes it had when last read.
	Nodes int
	// LastRead is when the last round that read it began (zero if none
	// did); Lag is how old that reading was when the last round ended.
	LastRead time.Time
	Lag      time.Duration
	// Err is the last read's error, until one succeeds; Errors counts the
	// reads that failed.
	Err    error
	Errors uint64
	// ReadTime is how long its last read that answered took; Timeout how
	// long the last round waited for it at most (three times its reads'
	// average, within Config.PeerTimeout and Config.MaxPeerTimeout).
	ReadTime, Timeout time.Duration
	// Unsettled reports that its last reading that answered may miss what
	// its Redis's earlier incarnations counted (as Status.Unsettled): the
	// keys are charged the whole limit for it.
	Unsettled bool
}

// Status returns what the last round found. It does not wait for a round
// in flight.
func (s *Store) Status() Status {
	if st := s.status.Load(); st != nil {
		out := *st
		out.Unseen = s.unseenN.Load()
		return out
	}
	st := Status{Region: s.cfg.Region, Regions: len(s.names)}
	for _, p := range s.cfg.Peers {
		st.Peers = append(st.Peers, PeerStatus{Name: p.Name, State: Unreachable})
	}
	return st
}

// publishFailed makes a round whose home read failed visible to Status:
// the peers as the round before found them. roundMu is held.
func (s *Store) publishFailed() {
	s.rs.failed++
	st := s.Status()
	st.Unseen = s.unseenN.Load()
	st.Rounds, st.Failed, st.LastRound, st.CutRounds = s.rs.rounds, s.rs.failed, time.UnixMicro(s.rs.lastStart), s.rs.cutRounds
	s.status.Store(&st)
}

// publish makes a round that read its home site visible to Status; failed
// when its beat failed. roundMu is held.
func (s *Store) publish(cut, failed bool, end time.Time) {
	rs := &s.rs
	if failed {
		rs.failed++
	}
	if cut {
		rs.cutRounds++
	}
	st := &Status{Region: s.cfg.Region, Regions: int(s.regions.Load()), Rounds: rs.rounds, Failed: rs.failed,
		LastRound: time.UnixMicro(rs.lastStart), Cut: cut, CutRounds: rs.cutRounds, Unseen: s.unseenN.Load(),
		Unsettled: rs.homeUnsettled}
	for _, p := range rs.peers {
		ps := PeerStatus{Name: p.name, State: p.state, Nodes: p.nodes, LastRead: p.lastOK, Err: p.err, Errors: p.errors,
			ReadTime: p.took, Timeout: p.timeout, Unsettled: p.unsettled}
		if !p.lastOK.IsZero() {
			ps.Lag = end.Sub(p.lastOK)
		}
		st.Peers = append(st.Peers, ps)
	}
	s.status.Store(st)
}

// Use is a global key's count in each region, as the node last read it:
// for a token_bucket or gcra, its count in the window of the layer's
// count of it (see the package documentation).
type Use struct {
	// Regions holds each region's count, this region's first, then the
	// peers' in the order of Config.Peers (the last known count of one
	// cut off).
	Regions []RegionUse
	// Cap is the most this region's count may reach until the next round;
	// Full reports that the regions together had nothing left.
	Cap  int64
	Full bool
	// At is when the round that read them began.
	At time.Time
}

// RegionUse is one region's count of a key: as last read (Count), and
// what the round counted for it (Charged: the count, or, for a peer the
// round did not read, the most it may have reached; see
// docs/regions.md, Cut off).
type RegionUse struct {
	Region         string
	Count, Charged int64
}

// Usage returns key's counts in every region as the last round read
// them, and false if the node has none (the key is not global, or not in
// use here).
func (s *Store) Usage(key string) (Use, bool) {
	e := s.tab.lookup(key)
	if e == nil {
		e = s.tab.lookup(key + bucketSuffix)
	}
	if e == nil {
		return Use{}, false
	}
	g := e.grant.Load()
	if g == nil {
		return Use{}, false
	}
	u := Use{Cap: g.cap, Full: g.full, At: g.at, Regions: []RegionUse{{s.cfg.Region, g.counts[0], g.charge[0]}}}
	for i, p := range s.cfg.Peers {
		u.Regions = append(u.Regions, RegionUse{p.Name, g.counts[1+i], g.charge[1+i]})
	}
	return u, true
}
