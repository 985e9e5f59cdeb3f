// Package regions decorates a region's sluice.Store so that a limit of
// scope global is one limit for all regions together, while a decision
// reads and writes only its own region's store and the node's memory: the
// other regions are read in the background, never on a request's path.
//
// Each region keeps, in its own store, its own count of each global key
// (the region's hits only). A request passes when that count stays within
// the region's cap, which a node sets every round (Config.SyncInterval)
// from its view of all regions' counts, read from every region's store
// (Site), its own first:
//
//	cap = own + max(⌊(L − V) / (R × k)⌋, 1)   while V < L, else own
//
// where L is the limit, V the sum of the counts, R the regions alive and
// k Config.Share. Across any number of regions and nodes, a window of a
// fixed_window limit admits at most
//
//	L − 1 + R × max(⌊L / (R × k)⌋, 1)
//
// hits (a sliding_window's weighted count as much, plus what its previous
// window's weight gives back while a cap ages; see docs/regions.md). The
// price is filling slowly: the regions together take about 1/k of what
// is left each round.
//
// A node that cannot read a peer in a round, or finds that a node of a
// peer has not read it for Config.EchoRounds of its rounds (every node's
// record echoes the round of each record it read last), is cut off: its
// region's count stops at its share ⌈L/Rc⌉ (Rc the regions configured), or
// stays where it was if already past it; and it charges each peer it
// cannot read that peer's last count known, at least its share, plus what
// the peer may have granted itself before noticing the cut. A peer it has
// not read since its own record may have expired (it stopped for
// Config.NodeLife/2 or more), or never read, it charges the whole limit.
// So the bound holds through partitions, one-way cuts, cuts that are not
// transitive, and nodes that stop and come back; a cut-off region admits
// at most its share of a window.
//
// A region whose board is kept but has no live node (its servers are
// gone) is dead: its counts are read and counted, it takes no share.
//
// A region whose store lost its data (a Redis restarted without
// persistence) has a new incarnation on its board: each of its nodes
// carries what it knew of the earlier ones into it (Site.Carry), beside
// the counts, where every node reads it; until all its live nodes have,
// a reading of it charges every key the whole limit.
//
// Rounds only read across regions; what a region learns from another is
// that region's own counts, absolute figures that a later reading
// replaces, so a reading applied twice, late or out of order counts
// nothing twice. Nothing is written across regions.
//
// Requests of scope region pass through untouched.
package regions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Config configures a Store. A zero field means its default.
type Config struct {
	// Region names this node's region. Required.
	Region string
	// Node names this node on its region's board (default: 16 random hex
	// digits). Two live nodes must not share a name.
	Node string
	// Home is this region's store as a Site: where the node beats and
	// reads its region's counts. It must see the counts the wrapped store
	// keeps (RedisSite over the same Redis and key prefix). Required.
	Home Site
	// Peers are the other regions, each by name and Site. Every region
	// must list the same regions (a mismatch cuts them off from each
	// other, see Node.Regions).
	Peers []Peer
	// SyncInterval is how often a node runs a round (default 100ms): a
	// round beats, reads its home counts, then every peer's, at once,
	// and sets the caps. A round waits for its slowest peer (at most
	// PeerTimeout); the next starts SyncInterval after it began, or when
	// it ends if later. Negative: no rounds run by themselves (tests call
	// Sync).
	SyncInterval time.Duration
	// PeerTimeout is the least a round waits for a peer's read (default
	// 500ms); a peer not read in time is cut off for that round. A round
	// waits for a peer three times its reads' moving average, within
	// PeerTimeout and MaxPeerTimeout, so that a slow peer is read (its
	// state lagging), not cut off.
	PeerTimeout time.Duration
	// MaxPeerTimeout is the most a round waits for a peer, and how long a
	// read goes on in the background after the round stopped waiting, to
	// measure a slow peer (default 4 × PeerTimeout, 2s).
	MaxPeerTimeout time.Duration
	// Share is k in the cap (default 10): a round gives a region 1/(R×k)
	// of what is left, so the limit is overshot by at most 1/k of it.
	Share int64
	// EchoRounds is how many of its rounds a node grants while a peer's
	// node has not echoed its record (default 4). A record's echo is at
	// best 2 rounds old (written at the start of the round after the one
	// that read it), so less than 2 cuts every round off.
	EchoRounds uint64
	// CapLife is how long a sliding_window's cap stays in use without a
	// round that renews it (default 2 × (PeerTimeout + SyncInterval),
	// 1.2s): past it, a key is decided as a key never seen. A
	// fixed_window's cap (and a bucket's count's) stays in use for it or
	// 2 × (MaxPeerTimeout + SyncInterval) if longer (4.2s by default), so
	// that rounds waiting for a lagging peer leave no gap between caps.
	CapLife time.Duration
	// NodeLife is how long a node's record stays on its board after its
	// last beat (default 2s); a node that stops beating leaves its
	// region's count of nodes then.
	NodeLife time.Duration
	// MaxBytes bounds the memory of the table of global keys, keys
	// included (default 8 MiB). A key that finds it full is decided as a
	// key never seen.
	MaxBytes int64
	// Now is the clock the node measures rounds and caps by (default
	// time.Now). Windows are the home site's clock's.
	Now func() time.Time
	// Errors, if set, receives each round's error (a peer that failed is
	// not an error: see Peers). Called from the round's goroutine.
	Errors func(error)
}

// Peer is another region, as Config.Peers lists it.
type Peer struct {
	Name string
	Site Site
}

// defaultShare is Share's default, which the tests' bounds use.
const defaultShare = 10

// DefaultConfig returns the default configuration: what every zero field
// of a Config means. Region and Home have none: they are required.
func DefaultConfig() Config {
	return Config{
		SyncInterval: 100 * time.Millisecond,  // a round ten times a second
		PeerTimeout:  500 * time.Millisecond,  // a round waits at least this for a peer (3 × its reads)
		Share:        defaultShare,            // overshoot at most a tenth of what is left
		EchoRounds:   4,                       // a peer's echo may be 2 rounds late, and 2 more
		CapLife:      1200 * time.Millisecond, // 2 × (PeerTimeout + SyncInterval), from those given
		NodeLife:     2 * time.Second,         // a node that stops beating leaves the count then
		MaxBytes:     8 << 20,                 // 8 MiB of global keys
		Now:          time.Now,
		// MaxPeerTimeout: 4 × PeerTimeout, from the one given (2s)
		// Node: 16 random hex digits; Peers: none; Errors: nil, not told
	}
}

func (c Config) withDefaults() (Config, error) {
	if c.Region == "" {
		return c, errors.New("regions: no region name")
	}
	if c.Home == nil {
		return c, errors.New("regions: no home site")
	}
	seen := map[string]bool{c.Region: true}
	for _, p := range c.Peers {
		if p.Name == "" || p.Site == nil {
			return c, errors.New("regions: a peer needs a name and a site")
		}
		if seen[p.Name] {
			return c, fmt.Errorf("regions: region %q given twice", p.Name)
		}
		seen[p.Name] = true
	}
	if c.Node == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.Node = hex.EncodeToString(b[:])
	}
	d := DefaultConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.SyncInterval, d.SyncInterval)
	set(&c.PeerTimeout, d.PeerTimeout)
	set(&c.MaxPeerTimeout, 4*c.PeerTimeout)
	if c.MaxPeerTimeout < c.PeerTimeout {
		return c, fmt.Errorf("regions: MaxPeerTimeout %v below PeerTimeout %v", c.MaxPeerTimeout, c.PeerTimeout)
	}
	set(&c.CapLife, 2*(c.PeerTimeout+max(c.SyncInterval, 0)))
	set(&c.NodeLife, d.NodeLife)
	if c.Share <= 0 {
		c.Share = d.Share
	}
	if c.EchoRounds == 0 {
		c.EchoRounds = d.EchoRounds
	}
	if c.EchoRounds < 2 {
		return c, fmt.Errorf("regions: EchoRounds %d: at least 2", c.EchoRounds)
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Store is a sluice.Store that decides global requests against caps set
// by its rounds and passes the others to the store it wraps. It is safe
// for concurrent use; Close stops its rounds.
type Store struct {
	inner sluice.Store
	cfg   Config
	names []string // every region's name, sorted
	tab   *table

	offset  atomic.Int64 // home clock − local clock, µs, as the last round measured it
	margin  atomic.Int64 // how far off offset may be, µs: the home read's round trip
	regions atomic.Int64 // R: regions alive or unreachable, as the last round counted them
	next    atomic.Int64 // local µs by which the next round should have set caps
	unseenN atomic.Uint64

	roundMu sync.Mutex // serializes rounds and guards what they keep
	rs      roundState
	status  atomic.Pointer[Status]

	clocks   []peerClock     // per peer, as Config.Peers
	bg       context.Context // the peers' reads, which may outlive a round; cancelled by Close
	bgCancel context.CancelFunc
	reads    sync.WaitGroup // the peers' reads in flight

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store that decides through inner, which must keep its
// counts where cfg.Home reads them. Unless cfg.SyncInterval is negative,
// it starts the goroutine that runs rounds; Close stops it.
func New(inner sluice.Store, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	names := []string{cfg.Region}
	for _, p := range cfg.Peers {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	s := &Store{inner: inner, cfg: cfg, names: names, tab: newTable(cfg.MaxBytes, len(cfg.Peers)),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.regions.Store(int64(len(names)))
	s.clocks = make([]peerClock, len(cfg.Peers))
	s.bg, s.bgCancel = context.WithCancel(context.Background())
	s.rs.peers = make([]peerState, len(cfg.Peers))
	for i, p := range cfg.Peers {
		s.rs.peers[i].name = p.Name
	}
	if cfg.SyncInterval < 0 {
		close(s.done)
		return s, nil
	}
	go s.loop()
	return s, nil
}

// Close stops the rounds. It does not close the wrapped store or the
// sites.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	s.bgCancel()
	s.reads.Wait()
	return nil
}

// loop runs rounds every SyncInterval, and at once when a key needs its
// first cap, until Close.
func (s *Store) loop() {
	defer close(s.done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.kick:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.MaxPeerTimeout+s.cfg.SyncInterval)
		if err := s.Sync(ctx); err != nil && s.cfg.Errors != nil {
			s.cfg.Errors(err)
		}
		cancel()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(max(s.cfg.SyncInterval-time.Since(start), 0))
	}
}

// TakeAll implements sluice.Store: the requests of scope global are
// decided on this region's count against its cap, the others as the
// wrapped store decides them, all in one call to it. A token_bucket or
// gcra request of scope global is decided twice in that call: on the
// region's own bucket, as it is, and on its count under the cap (see
// counted).
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	var glob []int
	for i := range reqs {
		if Decides(reqs[i]) {
			glob = append(glob, i)
		}
	}
	if len(glob) == 0 {
		return s.inner.TakeAll(ctx, reqs, ds)
	}
	now := s.cfg.Now()
	out := slices.Clone(reqs)
	caps := make([]use, len(glob))
	counters := make([]int, len(glob)) // where each one's count is decided in out
	for j, i := range glob {
		c, bucket := counted(reqs[i])
		caps[j] = s.capFor(c, now)
		if !bucket {
			out[i], counters[j] = caps[j].request(c), i
			continue
		}
		out[i].Group = c.Group
		out = append(out, caps[j].request(c))
		counters[j] = len(out) - 1
	}
	all := ds
	if len(out) > len(reqs) {
		all = make([]sluice.Decision, len(out))
	}
	if err := s.inner.TakeAll(ctx, out, all); err != nil {
		return err
	}
	for j, i := range glob {
		c, bucket := counted(reqs[i])
		d := s.decision(c, caps[j], all[counters[j]], now)
		if bucket {
			d = both(all[i], d)
		}
		ds[i] = d
	}
	return nil
}

// global reports whether l is a limit the layer keeps one of for all
// regions: fixed_window, sliding_window, token_bucket, gcra. The others
// (leaky_bucket, sliding_log) pass through as scope region; rules refuse
// them at scope global.
func global(l sluice.Limit) bool {
	switch l.Algorithm {
	case sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA:
		return true
	}
	return false
}

// bucketSuffix ends the key of a bucket's count (see counted).
const bucketSuffix = "\x00regions"

// counted returns the request whose count the layer keeps one limit of
// for all regions, for r, of scope global; and whether r is a bucket's.
// For a window limit, r itself. For a token_bucket or gcra of capacity C
// and rate r per period P, a fixed_window of W = ⌈C × P / r⌉ that admits
// C, under r's key and bucketSuffix, in r's group (its key when it has
// none, so that one atomic call decides it and r): every region keeps its
// own bucket, which shapes its requests as the limit says, and the regions
// together admit C a window of W (the limit's capacity, and its rate).
func counted(r sluice.Request) (sluice.Request, bool) {
	l := r.Limit
	if !l.Algorithm.HasBurst() {
		return r, false
	}
	c := l.Capacity()
	p := l.Period.Microseconds()
	w := p
	if c > 0 && l.Rate > 0 {
		w = max(ceilDiv(c, l.Rate)*p, 1)
		if hi, lo := bits.Mul64(uint64(c), uint64(p)); hi == 0 && lo < 1<<62 {
			w = max(ceilDiv(int64(lo), l.Rate), 1)
		}
	}
	group := r.Group
	if group == "" {
		group = r.Key
	}
	return sluice.Request{Key: r.Key + bucketSuffix, Group: group, Cost: r.Cost, Scope: r.Scope, Sync: r.Sync,
		Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: c, Period: time.Duration(w) * time.Microsecond}}, true
}

// both returns the decision of a bucket's request from b, its own
// bucket's, and c, its count's: allowed when both are, with what remains
// of the smaller, retrying when both would pass.
func both(b, c sluice.Decision) sluice.Decision {
	d := b
	d.Allowed = b.Allowed && c.Allowed
	d.Remaining = min(b.Remaining, c.Remaining)
	if !c.Allowed {
		if b.Allowed {
			d.RetryAfter = c.RetryAfter
		} else {
			d.RetryAfter = max(b.RetryAfter, c.RetryAfter)
		}
		d.Wait = 0
	}
	return d
}

// CheckLimit is the layer's own veto on l, which store/stack composes
// with that of the store the layer decides on, check: for a token_bucket
// or gcra, check on the count the layer keeps of it at scope global (see
// counted), which a limit of scope region never uses but the veto, which
// sees no scope, cannot tell apart; nil for the other limits. It does no
// I/O. A nil check accepts everything.
func CheckLimit(l sluice.Limit, check func(sluice.Limit) error) error {
	if check == nil {
		return nil
	}
	if cr, bucket := counted(sluice.Request{Limit: l}); bucket {
		if err := check(cr.Limit); err != nil {
			return fmt.Errorf("its count across regions: %w", err)
		}
	}
	return nil
}

// Decides reports whether the layer decides r: a request of scope global
// whose limit it keeps one of for all regions (see global). The others
// pass to the store it wraps untouched. The layers over this one send the
// requests it decides straight to it: never from a near cache's state,
// never leased, never written back, since a cap moves every round.
func Decides(r sluice.Request) bool { return r.Scope == sluice.GlobalScope && global(r.Limit) }

// Sync runs one round now: it beats, reads the home counts of the keys in
// use, then every peer's, and sets their caps. Rounds run one at a time.
// It returns an error when the home site failed (the caps then stay as
// they were); a peer that failed is cut off for the round, not an error.
func (s *Store) Sync(ctx context.Context) error {
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	return s.round(ctx)
}
