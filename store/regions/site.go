package regions

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
)

// Site is one region's store as the regions layer reads and writes it in
// the background: the region's own counts of its global keys, and its
// board of node records. RedisSite implements it over the region's Redis;
// the home site is the region's own store, and a peer's site is the other
// region's, reached across the WAN (or through a local read replica of it).
// A Site is safe for concurrent use.
type Site interface {
	// Read returns, in one round trip where it can, the site's clock, what
	// the limit of each request counts now on its key (a fixed_window: the
	// hits in the window that holds the site's now; a sliding_window: its
	// count with the previous window weighted in; Cost is ignored), the
	// board: the node records that have not expired, and what was carried
	// of the keys whose carried is set (Reading.Carried; carried may be
	// nil: none). It changes nothing.
	Read(ctx context.Context, reqs []sluice.Request, carried []bool) (Reading, error)
	// Beat writes n's record on the board, to expire ttl after the site's
	// now, and forgets records that have expired. Only a node's home site
	// is beaten.
	Beat(ctx context.Context, n Node, ttl time.Duration) error
	// Carry writes what earlier incarnations of the site's data counted
	// of each key, as a node of the region knew them, where Read returns
	// them (Reading.Carried): each merged by maximum with what is there
	// for its window (a later window's replaces it; an earlier one's is
	// replaced). A node carries to its home site only, and beats the
	// incarnation it carried to (Node.Inc) after Carry returned: a Read
	// that finds that record finds what it carried.
	Carry(ctx context.Context, cs []Carried) error
}

// asked reports whether a read given carried asks for the carried count of
// its key of index i: carried may be nil or short, asking for none past it.
func asked(carried []bool, i int) bool { return i < len(carried) && carried[i] }

// Carried is what the earlier incarnations of a region's data (its Redis
// before it restarted empty) counted of a key in a window, as a node of
// the region knew it: put where the new incarnation's readers find it
// beside the counts, never in them, so that no reader counts it twice.
type Carried struct {
	// Key is the request's key (Site.Carry; empty in a Reading).
	Key string
	// Window is the window's start, µs on the site's clock; 0 when
	// nothing is carried.
	Window int64
	// Count is what the earlier incarnations counted in it: a
	// fixed_window's hits, a sliding_window's weighted count.
	Count int64
	// Until is when it stops mattering, µs on the site's clock (the
	// window's end; a sliding_window's next one's). Site.Carry only.
	Until int64
}

// ErrRefused is wrapped by the error of a reading the layer refuses: a
// reply over its bounds in bytes (MaxPeerReply, a board's records), one
// malformed, or counts that do not match the keys asked. The peer is then
// Refused for the round: cut off, and charged as an unreachable one.
var ErrRefused = errors.New("regions: reply refused")

// MaxPeerReply is the most bytes a reply from a peer's Redis may take
// (store/redis's Config.MaxReply, which store/stack sets on the peers'
// connections): a board of 128 live records of 32 KB, or the counts of
// about 60,000 keys.
const MaxPeerReply = 4 << 20

// Reading is what Site.Read returns.
type Reading struct {
	// Now is the site's clock when it read, in µs since the Unix epoch.
	Now int64
	// Counts holds one figure per request, in order.
	Counts []int64
	// Known reports whether sluice has kept a board on the site lately (a
	// board outlives its last node, see RedisSite): a region known but
	// without a live node is dead; one not known has never run there, or
	// runs with another key prefix, which no region can see.
	Known bool
	// Incarnation names the site's data: it changes when the site lost
	// it (a Redis restarted without persistence), so that the counts it
	// held before are added to those it counts from zero again. Empty
	// when unknown.
	Incarnation string
	// Nodes are the records on the board that have not expired.
	Nodes []Node
	// Born is when the first beat of the board's incarnation was, µs on
	// the site's clock, or later (a board of a version before it); 0 when
	// unknown. No window that began after it holds a count of an earlier
	// incarnation.
	Born int64
	// Carried holds, per request in order, what the site's earlier
	// incarnations counted of its key, as its nodes carried it (see
	// Site.Carry), for the requests Read was asked to; a zero Carried when
	// nothing was, or it was not asked. Read after Nodes: a record whose
	// Inc is Incarnation was beaten after its node carried.
	Carried []Carried
}

// Node is a node's record on its home board, read by the other regions'
// nodes every round.
type Node struct {
	// Region and ID name the node.
	Region string `json:"region"`
	ID     string `json:"id"`
	// Seq numbers the node's rounds: the record of round Seq.
	Seq uint64 `json:"seq"`
	// Regions are the names of every region the node counts, itself
	// included, sorted: regions configured differently are cut off from
	// each other until they agree.
	Regions []string `json:"regions"`
	// Seen maps the ID of each node of another region whose record this
	// node read in its last round to that record's Seq: the echo by which
	// a node learns that the others still read it.
	Seen map[string]uint64 `json:"seen,omitempty"`
	// Inc is the incarnation of the home site the node has carried what
	// it knows into (Site.Carry): a record whose Inc is not its board's
	// incarnation is of a node that may know counts of an earlier one the
	// board does not carry yet. Empty: the node knows no count yet.
	Inc string `json:"inc,omitempty"`
}
