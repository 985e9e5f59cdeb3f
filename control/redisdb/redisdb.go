// Package redisdb is a rules database (control.DB) in Redis: each domain's
// rules a versioned document with its history, the overrides, and a
// generation that every change raises and publishes, all under one hash
// tag so that a Redis Cluster keeps them on one shard and every change is
// one atomic script.
package redisdb

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/control"
)

// Config configures a DB. A zero field means its default.
type Config struct {
	// Name is the hash tag of every key: {Name}:gen, {Name}:domains,
	// {Name}:overrides, {Name}:history:DOMAIN and the channel
	// {Name}:changes; "" means "sluice:rules". It must not hold { or }.
	Name string
	// History is how many versions of each domain are kept; zero means
	// 100.
	History int
	// Timeout bounds each call to Redis; zero means 2 seconds.
	Timeout time.Duration
	// TLS, if not nil, is the TLS configuration of a rediss:// URL (nil:
	// the system's roots and the URL's host name).
	TLS *tls.Config
	// ClientOption reads Open's URL with TLS as the store reads its own
	// (store/stack.ClientOption, which the server passes: redis+cluster://,
	// redis+sentinel:// and the store's query parameters). Default nil:
	// rueidis.ParseURL, which reads redis://, rediss:// and unix:// URLs.
	ClientOption func(rawURL string, tls *tls.Config) (rueidis.ClientOption, error)
	// MaxStateBytes caps the state a read returns (the domains' and the
	// overrides' JSON, and a domain's history); zero means
	// control.MaxStateBytes. A state above it is refused before it is
	// sent.
	MaxStateBytes int
	// MaxDocBytes caps one domain's version; zero means
	// control.MaxDocBytes.
	MaxDocBytes int
}

// DB is a rules database in Redis. It is safe for concurrent use.
type DB struct {
	opt     rueidis.ClientOption
	mu      sync.Mutex     // guards client and tried
	client  rueidis.Client // nil until connected
	tried   time.Time      // the last failed attempt to connect
	cfg     Config
	gen     string
	domains string
	ovs     string
	channel string
}

var (
	_ control.DB             = (*DB)(nil)
	_ control.OverrideReader = (*DB)(nil)
)

// commitScript applies one change if the generation is still ARGV[1]:
// KEYS gen, domains, overrides, history; ARGV gen, kind (doc, ovset,
// ovdel), field, value, history length, channel. It returns {1, new
// generation} or {0, the generation found}.
var commitScript = rueidis.NewLuaScript(`
local g = tonumber(redis.call('GET', KEYS[1]) or '0')
if g ~= tonumber(ARGV[1]) then return {0, g} end
local kind = ARGV[2]
if kind == 'doc' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('LTRIM', KEYS[4], -tonumber(ARGV[5]), -1)
elseif kind == 'ovset' then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
elseif kind == 'ovdel' then
  redis.call('HDEL', KEYS[3], ARGV[3])
else
  return redis.error_reply('unknown change ' .. kind)
end
g = redis.call('INCR', KEYS[1])
redis.call('PUBLISH', ARGV[6], g)
return {1, g}
`)

// sizesLua is the Lua function over_cap(hash, cap, total, doc_cap): the
// bytes of a hash's fields and values added to total, measured without
// copying a value, and what exceeds a cap: {total} within them, else
// {total, field (its first 128 bytes), bytes of its value}.
const sizesLua = `
local function over_cap(hash, cap, total, doc_cap)
  for _, f in ipairs(redis.call('HKEYS', hash)) do
    local n = redis.call('HSTRLEN', hash, f)
    total = total + #f + n
    if total > cap or n > doc_cap then return {total, string.sub(f, 1, 128), n} end
  end
  return {total}
end
`

// stateScript reads the generation, the domains and the overrides at once
// (KEYS gen, domains, overrides; ARGV the cap on the whole, the cap on a
// document), or, when they are above a cap, {'over', field, its bytes,
// the bytes counted} instead, before a byte of them is sent.
var stateScript = rueidis.NewLuaScript(sizesLua + `
local cap, doc_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = over_cap(KEYS[2], cap, 0, doc_cap)
if s[2] then return {'over', s[2], s[3], s[1]} end
s = over_cap(KEYS[3], cap, s[1], cap)
if s[2] then return {'over', s[2], s[3], s[1]} end
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
`)

// overrideScript reads the generation, the domains, the number of
// overrides and the override of ARGV[3] (KEYS gen, domains, overrides;
// ARGV the caps as stateScript's, the key), the domains capped as
// stateScript caps them.
var overrideScript = rueidis.NewLuaScript(sizesLua + `
local s = over_cap(KEYS[2], tonumber(ARGV[1]), 0, tonumber(ARGV[2]))
if s[2] then return {'over', s[2], s[3], s[1]} end
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2]), redis.call('HLEN', KEYS[3]), redis.call('HGET', KEYS[3], ARGV[3])}
`)

// historyScript reads the newest versions of a domain (KEYS history; ARGV
// the cap on their bytes, the most versions) that fit within the caps,
// oldest first.
var historyScript = rueidis.NewLuaScript(`
local cap, total, out = tonumber(ARGV[1]), 0, {}
local n = redis.call('LLEN', KEYS[1])
for i = n - 1, math.max(0, n - tonumber(ARGV[2])), -1 do
  local v = redis.call('LINDEX', KEYS[1], i)
  total = total + #v
  if total > cap then break end
  table.insert(out, 1, v)
end
return out
`)

// Open connects to the Redis at rawURL (a store URL: redis://,
// rediss://, redis+cluster://, redis+sentinel://). A Redis that does not
// answer yet is no error: calls fail with control.ErrUnavailable until it
// does.
func Open(rawURL string, cfg Config) (*DB, error) {
	cfg = cfg.withDefaults()
	if strings.ContainsAny(cfg.Name, "{}") {
		return nil, fmt.Errorf("rules database: Name %q must not hold { or }", cfg.Name)
	}
	parse := cfg.ClientOption
	if parse == nil {
		parse = func(rawURL string, tc *tls.Config) (rueidis.ClientOption, error) {
			opt, err := rueidis.ParseURL(rawURL)
			if tc != nil && opt.TLSConfig != nil { // rediss://
				opt.TLSConfig = tc
			}
			return opt, err
		}
	}
	opt, err := parse(rawURL, cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("rules database: %w", err)
	}
	opt.DisableAutoPipelining = false
	db := newDB(nil, cfg)
	db.opt = opt
	return db, nil
}

// New returns a DB over an open client, which the DB's Close closes.
func New(client rueidis.Client, cfg Config) *DB {
	return newDB(client, cfg.withDefaults())
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means.
func DefaultConfig() Config {
	return Config{
		Name:          "sluice:rules",        // the keys' hash tag
		History:       100,                   // versions kept per domain
		Timeout:       2 * time.Second,       // per call to Redis
		MaxStateBytes: control.MaxStateBytes, // a state above it is refused before it is sent
		MaxDocBytes:   control.MaxDocBytes,
		// TLS: nil, the system's roots; ClientOption: nil, rueidis.ParseURL
	}
}

// withDefaults returns cfg with its zero fields (and History, Timeout and
// the caps below zero) set to their defaults.
func (cfg Config) withDefaults() Config {
	d := DefaultConfig()
	if cfg.Name == "" {
		cfg.Name = d.Name
	}
	if cfg.History <= 0 {
		cfg.History = d.History
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = d.Timeout
	}
	if cfg.MaxStateBytes <= 0 {
		cfg.MaxStateBytes = d.MaxStateBytes
	}
	if cfg.MaxDocBytes <= 0 {
		cfg.MaxDocBytes = d.MaxDocBytes
	}
	return cfg
}

func newDB(client rueidis.Client, cfg Config) *DB {
	p := "{" + cfg.Name + "}:"
	return &DB{client: client, cfg: cfg, gen: p + "gen", domains: p + "domains", ovs: p + "overrides", channel: p + "changes"}
}

// Close closes the connections.
func (db *DB) Close() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.client != nil {
		db.client.Close()
	}
	return nil
}

// conn returns the client, connecting first if need be (rueidis dials
// when a client is made), at most once a second.
func (db *DB) conn() (rueidis.Client, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.client != nil {
		return db.client, nil
	}
	if time.Since(db.tried) < time.Second {
		return nil, fmt.Errorf("connect: %w: not connected", control.ErrUnavailable)
	}
	c, err := rueidis.NewClient(db.opt)
	if err != nil {
		db.tried = time.Now()
		return nil, fmt.Errorf("connect: %w: %w", control.ErrUnavailable, err)
	}
	db.client = c
	return c, nil
}

func (db *DB) historyKey(domain string) string { return "{" + db.cfg.Name + "}:history:" + domain }

func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, control.ErrUnavailable, err)
}

// retryRead calls read again, once, when it failed on the connection
// rather than by a timeout or an answer of Redis: a connection Redis
// closed (a restart) fails the first call made on it. Only reads are
// tried again.
func retryRead[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	v, err := read(ctx)
	if err != nil && errors.Is(err, control.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		var re *rueidis.RedisError
		if !errors.As(err, &re) {
			v, err = read(ctx)
		}
	}
	return v, err
}

// State reads the generation, every domain's current version and the
// overrides in one script call.
func (db *DB) State(ctx context.Context) (*control.State, error) { return retryRead(ctx, db.state) }

func (db *DB) state(ctx context.Context) (*control.State, error) {
	c, err := db.conn()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, db.cfg.Timeout)
	defer cancel()
	vs, err := stateScript.Exec(ctx, c, []string{db.gen, db.domains, db.ovs}, db.caps()).ToArray()
	if err != nil {
		return nil, unavailable("read rules database", err)
	}
	if err := db.overCap(vs); err != nil {
		return nil, err
	}
	if len(vs) != 3 {
		return nil, fmt.Errorf("read rules database: %d values, want 3", len(vs))
	}
	st, err := decodeDomains(vs[0], vs[1])
	if err != nil {
		return nil, err
	}
	if err := decodeHash(vs[2], func(v []byte) error {
		var o control.OverrideRecord
		if err := json.Unmarshal(v, &o); err != nil {
			return err
		}
		st.Overrides = append(st.Overrides, o)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read rules database: overrides: %w", err)
	}
	control.SortState(st)
	return st, nil
}

// caps are the scripts' arguments that cap what they read.
func (db *DB) caps() []string {
	return []string{strconv.Itoa(db.cfg.MaxStateBytes), strconv.Itoa(db.cfg.MaxDocBytes)}
}

// overCap returns the error of a script's answer that a cap was reached
// ({'over', field, its bytes, the bytes counted}), or nil.
func (db *DB) overCap(vs []rueidis.RedisMessage) error {
	if len(vs) != 4 {
		return nil
	}
	if s, _ := vs[0].ToString(); s != "over" {
		return nil
	}
	field, _ := vs[1].ToString()
	n, _ := vs[2].AsInt64()
	total, _ := vs[3].AsInt64()
	return fmt.Errorf("read rules database: %w: %q holds %d bytes (%d counted), above the cap of %d on a domain's version or %d on the whole: "+
		"not read; delete it from %s or %s", control.ErrUnavailable, field, n, total, db.cfg.MaxDocBytes, db.cfg.MaxStateBytes, db.domains, db.ovs)
}

// decodeDomains reads a generation and an HGETALL of the domains.
func decodeDomains(gen, domains rueidis.RedisMessage) (*control.State, error) {
	gs, err := gen.ToString()
	if err != nil {
		return nil, fmt.Errorf("read rules database: generation: %w", err)
	}
	st := &control.State{}
	if st.Generation, err = strconv.ParseInt(gs, 10, 64); err != nil {
		return nil, fmt.Errorf("read rules database: generation %q: %w", gs, err)
	}
	if err := decodeHash(domains, func(v []byte) error {
		var d control.Doc
		if err := json.Unmarshal(v, &d); err != nil {
			return err
		}
		st.Domains = append(st.Domains, d)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read rules database: domains: %w", err)
	}
	return st, nil
}

// ReadOverride reads the generation, every domain's current version, how
// many overrides there are and the one of key, in one script call.
func (db *DB) ReadOverride(ctx context.Context, key string) (*control.State, int, *control.OverrideRecord, error) {
	type answer struct {
		st  *control.State
		n   int
		cur *control.OverrideRecord
	}
	a, err := retryRead(ctx, func(ctx context.Context) (answer, error) {
		c, err := db.conn()
		if err != nil {
			return answer{}, err
		}
		ctx, cancel := context.WithTimeout(ctx, db.cfg.Timeout)
		defer cancel()
		vs, err := overrideScript.Exec(ctx, c, []string{db.gen, db.domains, db.ovs}, append(db.caps(), key)).ToArray()
		if err != nil {
			return answer{}, unavailable("read rules database", err)
		}
		if err := db.overCap(vs); err != nil {
			return answer{}, err
		}
		if len(vs) != 4 {
			return answer{}, fmt.Errorf("read rules database: %d values, want 4", len(vs))
		}
		var a answer
		if a.st, err = decodeDomains(vs[0], vs[1]); err != nil {
			return answer{}, err
		}
		n, err := vs[2].AsInt64()
		if err != nil {
			return answer{}, fmt.Errorf("read rules database: overrides: %w", err)
		}
		a.n = int(n)
		if v, err := vs[3].ToString(); err == nil {
			a.cur = &control.OverrideRecord{}
			if err := json.Unmarshal([]byte(v), a.cur); err != nil {
				return answer{}, fmt.Errorf("read rules database: override %s: %w", key, err)
			}
		} else if !rueidis.IsRedisNil(err) {
			return answer{}, fmt.Errorf("read rules database: override %s: %w", key, err)
		}
		control.SortState(a.st)
		return a, nil
	})
	return a.st, a.n, a.cur, err
}

// decodeHash calls f on each value of an HGETALL reply.
func decodeHash(m rueidis.RedisMessage, f func([]byte) error) error {
	kv, err := m.ToArray()
	if err != nil {
		return err
	}
	for i := 1; i < len(kv); i += 2 {
		s, err := kv[i].ToString()
		if err != nil {
			return err
		}
		if err := f([]byte(s)); err != nil {
			return err
		}
	}
	return nil
}

// Generation reads the generation.
func (db *DB) Generation(ctx context.Context) (int64, error) { return retryRead(ctx, db.generation) }

func (db *DB) generation(ctx context.Context) (int64, error) {
	c, err := db.conn()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, db.cfg.Timeout)
	defer cancel()
	g, err := c.Do(ctx, c.B().Get().Key(db.gen).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("read rules generation", err)
	}
	return g, nil
}

// History returns the versions of domain kept, oldest first.
func (db *DB) History(ctx context.Context, domain string) ([]control.Doc, error) {
	return retryRead(ctx, func(ctx context.Context) ([]control.Doc, error) { return db.history(ctx, domain) })
}

func (db *DB) history(ctx context.Context, domain string) ([]control.Doc, error) {
	c, err := db.conn()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, db.cfg.Timeout)
	defer cancel()
	vs, err := historyScript.Exec(ctx, c, []string{db.historyKey(domain)}, []string{strconv.Itoa(db.cfg.MaxStateBytes), strconv.Itoa(db.cfg.History)}).AsStrSlice()
	if err != nil {
		return nil, unavailable("read rules history", err)
	}
	out := make([]control.Doc, len(vs))
	for i, v := range vs {
		if err := json.Unmarshal([]byte(v), &out[i]); err != nil {
			return nil, fmt.Errorf("read rules history of %q: %w", domain, err)
		}
	}
	return out, nil
}

// Commit applies ch if the generation is still gen.
func (db *DB) Commit(ctx context.Context, gen int64, ch control.Change) (int64, error) {
	var kind, field string
	var value []byte
	var err error
	hist := db.historyKey("")
	switch {
	case ch.Doc != nil:
		kind, field, hist = "doc", ch.Doc.Domain, db.historyKey(ch.Doc.Domain)
		value, err = json.Marshal(ch.Doc)
	case ch.Override != nil:
		kind, field = "ovset", ch.Override.Key()
		value, err = json.Marshal(ch.Override)
	case ch.DeleteOverride != "":
		kind, field = "ovdel", ch.DeleteOverride
	default:
		return 0, errors.New("commit: an empty change")
	}
	if err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	c, err := db.conn()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, db.cfg.Timeout)
	defer cancel()
	vs, err := commitScript.Exec(ctx, c, []string{db.gen, db.domains, db.ovs, hist},
		[]string{strconv.FormatInt(gen, 10), kind, field, string(value), strconv.Itoa(db.cfg.History), db.channel}).AsIntSlice()
	if err != nil {
		return 0, unavailable("write rules database", err)
	}
	if len(vs) != 2 {
		return 0, fmt.Errorf("write rules database: %d values, want 2", len(vs))
	}
	if vs[0] == 0 {
		return vs[1], fmt.Errorf("generation %d, not %d: %w", vs[1], gen, control.ErrStale)
	}
	return vs[1], nil
}

// Subscribe calls notify with the generation of each change published,
// and with -1 each time the subscription starts (changes may have been
// missed before), until ctx ends, subscribing again a second after a lost
// connection.
func (db *DB) Subscribe(ctx context.Context, notify func(gen int64)) {
	hooked := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" {
			notify(-1)
		}
	})
	for ctx.Err() == nil {
		c, err := db.conn()
		if err == nil {
			err = c.Receive(hooked, c.B().Subscribe().Channel(db.channel).Build(), func(m rueidis.PubSubMessage) {
				if g, err := strconv.ParseInt(m.Message, 10, 64); err == nil {
					notify(g)
				}
			})
		}
		_ = err // the poll covers what a lost subscription misses
		select {
		case <-ctx.Done():
		case <-time.After(time.Second): // then subscribe again; the poll covers the gap
		}
	}
}
