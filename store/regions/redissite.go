package regions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
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
	counts Counter
	client func() (rueidis.Client, error) // an error until the Redis store has connected
	board  string
	life   time.Duration
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
// starts whatever its peers' state. A zero boardLife means
// DefaultBoardLife.
func NewRedisSite(counts Counter, conn func() (rueidis.Client, error), region, prefix string, boardLife time.Duration) *RedisSite {
	if boardLife <= 0 {
		boardLife = DefaultBoardLife
	}
	return &RedisSite{counts: counts, client: conn, board: prefix + "regions:board:" + region, life: boardLife}
}

var _ Site = (*RedisSite)(nil)

// beatScript writes a node's record, forgets those expired, and keeps the
// board for its life.
var beatScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSETNX', KEYS[1], 'incarnation', ARGV[5])
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

// Read implements Site: the board and the clock in one pipelined call
// (plain reads, which a read replica serves too), beside the counts'
// script call on the same connection.
func (rs *RedisSite) Read(ctx context.Context, reqs []sluice.Request) (Reading, error) {
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
	res := client.DoMulti(ctx, client.B().Time().Build(), client.B().Hgetall().Key(rs.board).Build())
	c := <-done
	if c.err != nil {
		return Reading{}, fmt.Errorf("read counts: %w", c.err)
	}
	r, err := readBoard(res)
	if err != nil {
		return Reading{}, fmt.Errorf("read %s: %w", rs.board, err)
	}
	r.Counts = c.c
	if c.at > 0 {
		r.Now = c.at
	}
	return r, nil
}

// The most a board read is trusted with: records, and bytes a record.
const (
	maxBoardNodes  = 1024
	maxRecordBytes = 64 << 10
)

// readBoard returns the Reading of a TIME and an HGETALL of the board.
func readBoard(res []rueidis.RedisResult) (Reading, error) {
	t, err := res[0].AsStrSlice()
	if err != nil {
		return Reading{}, err
	}
	if len(t) != 2 {
		return Reading{}, fmt.Errorf("TIME returned %d values", len(t))
	}
	sec, err1 := strconv.ParseInt(t[0], 10, 64)
	us, err2 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil {
		return Reading{}, fmt.Errorf("TIME returned %q", t)
	}
	r := Reading{Now: sec*1_000_000 + us}
	m, err := res[1].AsStrMap()
	if err != nil {
		return Reading{}, err
	}
	r.Known = len(m) > 0
	if len(m) > maxBoardNodes {
		return Reading{}, fmt.Errorf("%d records, more than the %d a board may hold", len(m), maxBoardNodes)
	}
	r.Incarnation = m["incarnation"]
	for f, v := range m {
		id, ok := strings.CutPrefix(f, "n:")
		if !ok {
			continue
		}
		if len(v) > maxRecordBytes {
			return Reading{}, fmt.Errorf("record of %q is %d bytes, more than %d", id, len(v), maxRecordBytes)
		}
		exp, rec, ok := strings.Cut(v, " ")
		e, err := strconv.ParseInt(exp, 10, 64)
		if !ok || err != nil {
			return Reading{}, fmt.Errorf("record of %q is malformed", id)
		}
		if e < r.Now {
			continue
		}
		var n Node
		if err := json.Unmarshal([]byte(rec), &n); err != nil {
			return Reading{}, fmt.Errorf("record of %q: %w", id, err)
		}
		r.Nodes = append(r.Nodes, n)
	}
	return r, nil
}
