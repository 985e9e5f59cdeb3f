package regions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

// Counter reads a region's counts without changing them: store/redis's
// SyncCounts, called with Cost 0 (it then writes nothing).
type Counter interface {
	SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error)
}

// RedisSite is a region's Redis as a Site: the counts are those its
// store/redis Store keeps (read by Counter), the board one hash,
// KeyPrefix + "regions:board:" + the region's name, whose fields are the
// nodes' records ("n:" and the node's name; the value the instant it
// expires on the Redis's clock, a space, the record) and the board's
// incarnation ("incarnation": random, set by the first beat of a board,
// so that a Redis that lost its data has a new one). A beat forgets the
// records that have expired and keeps the board for its life; a board
// without a live record is a dead region's.
type RedisSite struct {
	counts  Counter
	client  func() (rueidis.Client, error) // an error until the Redis store has connected
	refused func(error) bool               // whether an error is a reply the client refused
	board   string
	carry   string // the hash of what earlier incarnations counted (Carry), in the board's cluster slot
	life    time.Duration
}

// DefaultBoardLife is how long a board outlives its last beat unless
// NewRedisSite is told otherwise: a region whose servers are all gone is
// dead for a week, then unknown (cut off) until its name leaves the
// other regions' configurations.
const DefaultBoardLife = 7 * 24 * time.Hour

// NewRedisSite returns the site of region whose Redis counts reads and
// whose board the client conn returns reaches, under prefix (the store's
// KeyPrefix, the same in every region). conn is called at each read and
// beat, and returns an error while the Redis has not connected
// (store/redis's Store.Conn), which the read or beat returns: a server
// starts whatever its peers' state. refused, if not nil, tells the errors
// of replies the client refused (store/redis's ErrReplyTooLarge, with
// Config.MaxReply set to MaxPeerReply), which Read wraps in ErrRefused. A
// zero boardLife means DefaultBoardLife.
func NewRedisSite(counts Counter, conn func() (rueidis.Client, error), refused func(error) bool, region, prefix string, boardLife time.Duration) *RedisSite {
	if boardLife <= 0 {
		boardLife = DefaultBoardLife
	}
	board := prefix + "regions:board:" + region
	return &RedisSite{counts: counts, client: conn, refused: refused, board: board, carry: carryKey(board), life: boardLife}
}

// carryKey returns the key of the hash that holds what a board's earlier
// incarnations counted: in the board's cluster slot when it can be (the
// board's own hash tag, or the board's name as one), so that one
// pipelined call reads the board, then the hash, in that order.
func carryKey(board string) string {
	if i := strings.IndexByte(board, '{'); i >= 0 {
		if j := strings.IndexByte(board[i+1:], '}'); j > 0 {
			return board + ":carried" // the board's tag is the hash's
		}
	}
	return "{" + board + "}:carried"
}

var _ Site = (*RedisSite)(nil)

// beatScript writes a node's record, forgets those expired, and keeps the
// board for its life.
var beatScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSETNX', KEYS[1], 'incarnation', ARGV[5])
redis.call('HSETNX', KEYS[1], 'born', string.format('%d', now))
redis.call('HSET', KEYS[1], 'n:' .. ARGV[1], string.format('%d', now + tonumber(ARGV[3])) .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'n:' then
    local exp = tonumber(string.match(all[i + 1], '^(%d+) '))
    if exp == nil or exp < now then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return now`)

// Beat implements Site.
func (rs *RedisSite) Beat(ctx context.Context, n Node, ttl time.Duration) error {
	rec, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("beat: %w", err)
	}
	client, err := rs.client()
	if err != nil {
		return fmt.Errorf("beat %s: %w", rs.board, err)
	}
	var inc [8]byte
	_, _ = rand.Read(inc[:])
	args := []string{n.ID, string(rec), strconv.FormatInt(ttl.Microseconds(), 10), strconv.FormatInt(rs.life.Milliseconds(), 10),
		hex.EncodeToString(inc[:])}
	if err := beatScript.Exec(ctx, client, []string{rs.board}, args).Error(); err != nil {
		return fmt.Errorf("beat %s: %w", rs.board, err)
	}
	return nil
}

// carryScript merges what earlier incarnations counted of keys into the
// carry hash (ARGV: field, window, count, until in ms, for each key): a
// field's value is "window count"; a later window's replaces an earlier
// one's, a higher count of the same window a lower. The hash lives until
// the last until given.
var carryScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = 0
for i = 1, #ARGV, 4 do
  local w, c = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local keep = false
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    local ow, oc = string.match(old, '^(%d+) (%d+)$')
    ow, oc = tonumber(ow), tonumber(oc)
    keep = ow ~= nil and oc ~= nil and (ow > w or (ow == w and oc >= c))
  end
  if not keep then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ' .. ARGV[i + 2]) end
  last = math.max(last, tonumber(ARGV[i + 3]))
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl ~= -2 and (ttl < 0 or nowms + ttl < last) then redis.call('PEXPIREAT', KEYS[1], last) end
return 1`)

// carryBatch is how many keys one call of carryScript carries.
const carryBatch = 512

// Carry implements Site.
func (rs *RedisSite) Carry(ctx context.Context, cs []Carried) error {
	client, err := rs.client()
	if err != nil {
		return fmt.Errorf("carry %s: %w", rs.carry, err)
	}
	for len(cs) > 0 {
		n := min(len(cs), carryBatch)
		args := make([]string, 0, 4*n)
		for _, c := range cs[:n] {
			args = append(args, c.Key, strconv.FormatInt(c.Window, 10), strconv.FormatInt(c.Count, 10),
				strconv.FormatInt(ceilDiv(c.Until, 1000), 10))
		}
		if err := carryScript.Exec(ctx, client, []string{rs.carry}, args).Error(); err != nil {
			return fmt.Errorf("carry %s: %w", rs.carry, err)
		}
		cs = cs[n:]
	}
	return nil
}

// Read implements Site: the board, the clock and what the board's earlier
// incarnations counted of the keys in one pipelined call, in that order
// (plain reads, which a read replica serves too; two calls, the board's
// first, where a cluster puts the board and the carry hash apart), beside
// the counts' script call on the same connection.
func (rs *RedisSite) Read(ctx context.Context, reqs []sluice.Request, carried []bool) (Reading, error) {
	client, err := rs.client()
	if err != nil {
		return Reading{}, fmt.Errorf("read %s: %w", rs.board, err)
	}
	type counted struct {
		c   []int64
		at  int64
		err error
	}
	done := make(chan counted, 1)
	if len(reqs) > 0 {
		go func() {
			zero := make([]sluice.Request, len(reqs))
			for i, r := range reqs {
				zero[i] = r
				zero[i].Cost = 0
			}
			c, at, err := rs.counts.SyncCounts(ctx, zero, make([]int64, len(reqs)))
			done <- counted{c, at, err}
		}()
	} else {
		done <- counted{}
	}
	cmds := []rueidis.Completed{client.B().Time().Build(), client.B().Hgetall().Key(rs.board).Build()}
	var hm rueidis.Completed
	apart := false // the carry hash in another cluster slot than the board: read after it
	var fields []string
	for i, r := range reqs {
		if asked(carried, i) {
			fields = append(fields, r.Key)
		}
	}
	if len(fields) > 0 {
		hm = client.B().Hmget().Key(rs.carry).Field(fields...).Build()
		if apart = hm.Slot() != cmds[1].Slot(); !apart {
			cmds = append(cmds, hm)
		}
	}
	res := client.DoMulti(ctx, cmds...)
	if apart {
		res = append(res, client.Do(ctx, hm))
	}
	c := <-done
	if c.err != nil {
		return Reading{}, fmt.Errorf("read counts: %w", rs.wrap(c.err))
	}
	r, err := readBoard(res)
	if err != nil {
		return Reading{}, fmt.Errorf("read %s: %w", rs.board, rs.wrap(err))
	}
	if len(fields) > 0 {
		cs, err := readCarried(res[2], len(fields))
		if err != nil {
			return Reading{}, fmt.Errorf("read %s: %w", rs.carry, rs.wrap(err))
		}
		r.Carried = make([]Carried, len(reqs))
		for i := range reqs {
			if asked(carried, i) {
				r.Carried[i], cs = cs[0], cs[1:]
			}
		}
	}
	r.Counts = c.c
	if c.at > 0 {
		r.Now = c.at
	}
	return r, nil
}

// readCarried returns the Carried of an HMGET of the carry hash for n
// keys. A reply of another length, or a value that is not "window count"
// of two numbers, is refused (ErrRefused).
func readCarried(res rueidis.RedisResult, n int) ([]Carried, error) {
	vs, err := res.ToArray()
	if err != nil {
		return nil, err
	}
	if len(vs) != n {
		return nil, fmt.Errorf("%w: %d carried counts for %d keys", ErrRefused, len(vs), n)
	}
	out := make([]Carried, n)
	for i, v := range vs {
		if v.IsNil() {
			continue
		}
		s, err := v.ToString()
		if err != nil {
			return nil, err
		}
		w, c, ok := strings.Cut(s, " ")
		win, err1 := strconv.ParseInt(w, 10, 64)
		count, err2 := strconv.ParseInt(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || win <= 0 {
			return nil, fmt.Errorf("%w: a carried count %.40q", ErrRefused, s)
		}
		out[i] = Carried{Window: win, Count: count}
	}
	return out, nil
}

// wrap returns err, wrapped in ErrRefused when it is a reply the client
// refused.
func (rs *RedisSite) wrap(err error) error {
	if rs.refused != nil && rs.refused(err) && !errors.Is(err, ErrRefused) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// The most a board read is trusted with: fields (records live or expired,
// and the incarnation), live records, bytes a record, bytes a name (a
// node's ID, a region's), regions a record lists. A node's record echoes
// the live nodes of every other board, so these bound its own record too:
// 128 IDs of at most 64 bytes per peer.
const (
	maxBoardFields = 1024
	maxBoardNodes  = 128
	maxRecordBytes = 64 << 10
	maxNameBytes   = 64
	maxRecRegions  = 64
)

// readBoard returns the Reading of a TIME and an HGETALL of the board. A
// board over the bounds above, or malformed, is refused (ErrRefused).
func readBoard(res []rueidis.RedisResult) (Reading, error) {
	refuse := func(format string, args ...any) (Reading, error) {
		return Reading{}, fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...)
	}
	t, err := res[0].AsStrSlice()
	if err != nil {
		return Reading{}, err
	}
	if len(t) != 2 {
		return refuse("TIME returned %d values", len(t))
	}
	sec, err1 := strconv.ParseInt(t[0], 10, 64)
	us, err2 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil || sec < 0 || sec > 1<<40 || us < 0 || us >= 1_000_000 {
		return refuse("TIME returned %.40q", t)
	}
	r := Reading{Now: sec*1_000_000 + us}
	m, err := res[1].AsStrMap()
	if err != nil {
		return Reading{}, err
	}
	r.Known = len(m) > 0
	if len(m) > maxBoardFields {
		return refuse("%d records, more than the %d a board may hold", len(m), maxBoardFields)
	}
	r.Incarnation = m["incarnation"]
	if b, ok := m["born"]; ok {
		if r.Born, err = strconv.ParseInt(b, 10, 64); err != nil || r.Born <= 0 {
			return refuse("born %.40q", b)
		}
	}
	if len(r.Incarnation) > maxNameBytes {
		return refuse("an incarnation of %d bytes", len(r.Incarnation))
	}
	for f, v := range m {
		id, ok := strings.CutPrefix(f, "n:")
		if !ok {
			continue
		}
		n, live, err := readRecord(id, v, r.Now)
		if err != nil {
			return refuse("record of %.64q: %v", id, err)
		}
		if !live {
			continue
		}
		if len(r.Nodes) == maxBoardNodes {
			return refuse("more than %d live records", maxBoardNodes)
		}
		r.Nodes = append(r.Nodes, n)
	}
	return r, nil
}

// readRecord returns the node of a record, v, under field "n:" + id, and
// whether it is live at now (µs, the board's clock).
func readRecord(id, v string, now int64) (Node, bool, error) {
	var n Node
	if len(id) > maxNameBytes || len(v) > maxRecordBytes {
		return n, false, fmt.Errorf("%d bytes of name, %d of record: over %d, %d", len(id), len(v), maxNameBytes, maxRecordBytes)
	}
	exp, rec, ok := strings.Cut(v, " ")
	e, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil {
		return n, false, errors.New("malformed")
	}
	if e < now {
		return n, false, nil
	}
	if err := json.Unmarshal([]byte(rec), &n); err != nil {
		return n, false, err
	}
	if len(n.ID) > maxNameBytes || len(n.Region) > maxNameBytes || len(n.Inc) > maxNameBytes || len(n.Regions) > maxRecRegions || len(n.Seen) > maxBoardNodes*maxRecRegions {
		return n, false, errors.New("names or lists over their bounds")
	}
	for _, name := range n.Regions {
		if len(name) > maxNameBytes {
			return n, false, errors.New("a region's name over its bound")
		}
	}
	return n, true, nil
}
