package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

//go:embed servers.lua
var serversSource string

// serversScript runs servers.lua. It is immutable and shared.
var serversScript = rueidis.NewLuaScript(serversSource)

// serversKey is the sorted set of the servers that heartbeat, under the
// store's KeyPrefix; its hash tag keeps it on one node of a Redis Cluster.
const serversKey = "{sluice-servers}"

// fleetKey is the sorted set of every server that uses this Redis (Fleet),
// async or not, under the store's KeyPrefix.
const fleetKey = "{sluice-fleet}"

// maxHeartbeat is the longest heartbeat Heartbeat takes: a day.
const maxHeartbeat = 24 * time.Hour

// Heartbeat records that the server id shares this Redis (under its
// KeyPrefix) until ttl from now on the store's clock (Config.Now, or
// Redis's TIME), forgets the servers whose heartbeat ended, and returns how
// many servers are left, id included. A ttl of 0 removes id (a server
// that stops). store/localfirst's async mode counts the servers so, in
// one small script (servers.lua) on one key.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int64, error) {
	return s.beat(ctx, serversKey, id, ttl)
}

// Fleet is Heartbeat in a set of its own, which every server that uses this
// Redis joins, whatever its sync modes: store/stack counts the servers so,
// for decide's fail mode local, which divides a limit among them.
func (s *Store) Fleet(ctx context.Context, id string, ttl time.Duration) (int64, error) {
	return s.beat(ctx, fleetKey, id, ttl)
}

// beat is Heartbeat in the set under key.
func (s *Store) beat(ctx context.Context, key, id string, ttl time.Duration) (int64, error) {
	if id == "" || ttl < 0 || ttl > maxHeartbeat {
		return 0, fmt.Errorf("redis heartbeat %q: a server ID and a heartbeat of 0 to %v", id, maxHeartbeat)
	}
	if err := s.connected(); err != nil {
		return 0, fmt.Errorf("redis heartbeat: %w", err)
	}
	now := ""
	if s.cfg.Now != nil {
		now = strconv.FormatInt(s.cfg.Now().UnixMilli(), 10)
	}
	ms := ttl.Milliseconds()
	if ttl > 0 {
		ms = max(ms, 1)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := serversScript.Exec(ctx, s.client, []string{s.cfg.KeyPrefix + key},
		[]string{id, strconv.FormatInt(ms, 10), now}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("redis heartbeat: %w", err)
	}
	return n, nil
}
