// Package redis is sluice's distributed store: the states of rate-limited
// keys in Redis, a Redis Sentinel group or a Redis Cluster, so that several
// sluice servers share one limit per key exactly. New opens a Store on a
// URL (see Open) and connects in the background; every decision is one
// atomic Lua script on Redis's clock, whose decisions Go checks against
// its own transitions; a group's requests share a Cluster slot. Limits
// the script cannot compute exactly are refused (CheckLimit, ErrInexact).
// How the script batches, expires keys, stays exact and survives a
// failover: docs/stores.md, "Inside the Redis store".
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
)

// Config configures a Store. Start from DefaultConfig, or from the zero
// Config: a zero field means its default, as stated at each field and in
// DefaultConfig.
type Config struct {
	// KeyPrefix is put before every key (default "sluice:"; there is
	// always a prefix). It must not contain '{' or '}', so that a key's
	// own hash tag decides its cluster slot.
	KeyPrefix string
	// MaxBatch is the most decisions one batch carries (default 128). A
	// batch is one script call per cluster slot it touches (outside a
	// cluster: one call), sent pipelined. Larger batches cost Redis less per
	// decision but hold it longer: about 2µs per decision.
	MaxBatch int
	// BatchWindow is the longest a batch waits for more decisions after
	// its first one while other script calls are in flight (default
	// 20µs): it yields to the goroutines about to ask and takes what they
	// queue, and leaves once a yield brings nothing. When no call is in
	// flight, Redis is idle and a batch leaves at once with what is queued,
	// so a light load pays no window; under load, batches grow, and Redis
	// spends less per decision. Negative: never wait.
	BatchWindow time.Duration
	// MaxInFlight is how many batches may be in flight at once (one worker
	// goroutine each). Decisions that arrive meanwhile wait for the next
	// batch, so fewer batches in flight make larger ones. Default 2: Redis
	// runs one script at a time, and two batches keep it busy while the
	// next one gathers. In a cluster a batch's script calls go to every
	// node at once, pipelined, so 2 serve there too: more workers only
	// make smaller batches and more round trips (a local 3+3 cluster on two
	// cores: 66,000 decisions/s with 2, 37,000-46,000 with 6,
	// 15,000-18,000 with 48; BenchmarkTakeCluster).
	MaxInFlight int
	// Timeout bounds a script call that carries a decision whose context
	// has no deadline (default 1s); such a decision waits at most about
	// this long for a free call and this long for its own. A context's
	// deadline always bounds its decision. Give contexts deadlines.
	Timeout time.Duration
	// DialTimeout bounds connecting to a Redis node (default 1s).
	DialTimeout time.Duration
	// ExpiryMargin is how long a key at least outlives its reset time in
	// Redis (default 1s; at most twice as long), so that a key is never
	// forgotten before its state is as good as new, even when Redis's clock
	// and the decision's clock differ a little. With Now set to a fake
	// clock, make it longer than the test.
	ExpiryMargin time.Duration
	// ExpiryJitter spreads the keys' expiry (Envoy ratelimit's
	// EXPIRATION_JITTER_MAX_SECONDS): each script call's margin is
	// ExpiryMargin plus a random duration below half of it, so that the
	// keys of one window, which all reset at its end, leave Redis over
	// this long instead of at one instant, each living up to this much
	// longer. Zero (the default): no jitter.
	ExpiryJitter time.Duration
	// Now is the clock decisions are made by, read once per script call.
	// Nil (the default) means Redis's own TIME, read inside the script, so
	// that every sluice server agrees. Tests pass a fake clock.
	Now func() time.Time
	// TLS configures rediss:// connections. Nil (the default) means the
	// system's roots and the URL's host name.
	TLS *tls.Config
	// SentinelUsername and SentinelPassword authenticate the connections
	// to the sentinels of a redis+sentinel:// URL (the URL's own user and
	// password are the master's). Empty (the default): no AUTH to the
	// sentinels; a password alone: AUTH with the password. Other URLs
	// refuse them.
	SentinelUsername, SentinelPassword string
	// Retry is how often a Store made by New tries again to connect while
	// Redis does not answer (default 1s).
	Retry time.Duration
	// ConnectFailed, if set, is told of each failed attempt of a Store
	// made by New to connect, from the goroutine that tries. Default nil.
	ConnectFailed func(error)
	// MaxReply bounds each reply from Redis, in bytes as they arrive plus
	// what the client holds for each element an aggregate announces,
	// checked before the client reads the reply: a larger or malformed
	// one fails the connection (ErrReplyTooLarge) and the calls on it,
	// which are not sent again.
	// For a Redis that is input, as a peer region's is (store/regions).
	// Default 0: no bound.
	MaxReply int64
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means.
func DefaultConfig() Config {
	return Config{
		KeyPrefix:    "sluice:",             // the key space of a shared Redis needs one
		MaxBatch:     128,                   // ~250µs of Redis time per full batch
		BatchWindow:  20 * time.Microsecond, // a few goroutine yields
		MaxInFlight:  2,                     // one batch in Redis, one gathering
		Timeout:      time.Second,           // calls whose context has no deadline
		DialTimeout:  time.Second,           // per node
		ExpiryMargin: time.Second,           // beyond the reset time; at most twice
		ExpiryJitter: 0,                     // every key of a window leaves at once
		Now:          nil,                   // Redis's TIME
		TLS:          nil,                   // system roots, the URL's host name
		Retry:        time.Second,           // while Redis does not answer (New)
		// SentinelUsername, SentinelPassword: "", no AUTH to the sentinels
		// ConnectFailed: nil, told of nothing
		// MaxReply: 0, no bound on a reply (this region's own Redis)
	}
}

// withDefaults returns c with each zero field set to its default.
func (c Config) withDefaults() Config {
	def := DefaultConfig()
	if c.KeyPrefix == "" {
		c.KeyPrefix = def.KeyPrefix
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = def.MaxBatch
	}
	if c.BatchWindow == 0 {
		c.BatchWindow = def.BatchWindow
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = def.MaxInFlight
	}
	if c.Timeout == 0 {
		c.Timeout = def.Timeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = def.DialTimeout
	}
	if c.ExpiryMargin == 0 {
		c.ExpiryMargin = def.ExpiryMargin
	}
	if c.Retry == 0 {
		c.Retry = def.Retry
	}
	return c
}

// ErrClosed is returned by the methods of a closed Store.
var ErrClosed = errors.New("redis store closed")

// ErrConnecting is returned by the methods of a Store that New made until
// its first connection to Redis succeeds.
var ErrConnecting = errors.New("redis store not connected yet")

// full returns err, wrapped with sluice.ErrStoreFull when it is Redis's
// OOM: a server at its maxmemory under the noeviction policy refuses every
// write, and with it every script call that counts, rather than evict a
// count. The error's text stays Redis's own.
func full(err error) error {
	if rerr, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(rerr.Error(), "OOM ") {
		return fmt.Errorf("%w: %w", sluice.ErrStoreFull, err)
	}
	return err
}

// Store keeps the states of rate-limited keys in Redis. It is safe for
// concurrent use. Close stops its goroutines and its connections.
//
// TakeAll returns when Redis has answered or when its context is done,
// whichever comes first (a decision whose context has no deadline is
// bounded by Config.Timeout instead). When Redis is down or slow it
// returns an error at once or at the deadline; what to decide then is the
// caller's (package decide's fail modes).
//
// A Store made by New connects in the background: until Redis first
// answers, its calls fail at once with ErrConnecting, which the caller's
// fail mode decides, and it keeps trying every Config.Retry. So a sluice
// server started while its Redis is down serves in its fail mode and moves
// to Redis by itself, as it does when Redis fails later.
type Store struct {
	url string // the URL, for errors (redacted when shown)
	opt rueidis.ClientOption
	// client and sha (the SHA1 of takeScript) are set once, before up:
	// read them only after seeing up (connected does), or from a worker
	// running a call submitted after that.
	client  rueidis.Client
	sha     string
	up      atomic.Bool
	last    atomic.Pointer[error] // the last failed attempt's error (New)
	dialed  chan struct{}         // closed when New's attempts end
	cfg     Config
	cluster bool
	margin  string // Config.ExpiryMargin in ms
	limits  limitArgs
	pool    sync.Pool // of *call for Take, reused once decided

	calls  chan *call
	stop   chan struct{}
	base   context.Context // canceled by Close, bounds script calls
	cancel context.CancelFunc
	once   sync.Once
	wg     sync.WaitGroup

	inFlight atomic.Int32 // script calls being run by workers
	closed   atomic.Bool  // set by Close before it drains calls
}

var (
	_ sluice.Store        = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// CheckLimit implements sluice.LimitChecker: it is the package's
// CheckLimit, and refuses the limits the store cannot decide exactly.
func (s *Store) CheckLimit(l sluice.Limit) error { return CheckLimit(l) }

// Open connects to the Redis named by rawURL and returns a Store. The URL
// is one of
//
//	redis://[user:password@]host[:port][/db]       a single Redis
//	rediss://[user:password@]host[:port][/db]      the same over TLS
//	redis+cluster://[user:password@]host:port,host:port,...   a Redis Cluster (any nodes of it)
//	rediss+cluster://...                           the same over TLS
//	redis+sentinel://[user:password@]host:port[,host:port...]/mastername[/db]
//	unix://[user:password@]/path/to/redis.sock    a single Redis on a unix socket
//
// The port defaults to 6379. ctx bounds the connection check: a Redis
// that does not answer in time is an error.
func Open(ctx context.Context, rawURL string, cfg Config) (*Store, error) {
	s, err := newStore(rawURL, cfg)
	if err != nil {
		return nil, err
	}
	close(s.dialed)
	if err := s.connect(ctx); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// New returns a Store of the Redis rawURL names (see Open) that connects
// in the background. A URL or a Config no retry can fix is an error at
// once. The first attempt, bounded by Config.DialTimeout (at least 1s), is
// made before New returns, so that a Redis that answers is used from the
// first decision; then one every Config.Retry until one succeeds or Close
// is called, each failure told to Config.ConnectFailed.
func New(rawURL string, cfg Config) (*Store, error) {
	s, err := newStore(rawURL, cfg)
	if err != nil {
		return nil, err
	}
	if s.attempt() {
		close(s.dialed)
		return s, nil
	}
	go func() {
		defer close(s.dialed)
		t := time.NewTicker(s.cfg.Retry)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				if s.attempt() {
					return
				}
			}
		}
	}()
	return s, nil
}

// attempt is one of New's attempts to connect.
func (s *Store) attempt() bool {
	ctx, cancel := context.WithTimeout(s.base, max(s.cfg.DialTimeout, time.Second))
	defer cancel()
	if err := s.connect(ctx); err != nil {
		s.last.Store(&err)
		if s.cfg.ConnectFailed != nil {
			s.cfg.ConnectFailed(err)
		}
		return false
	}
	return true
}

// Ready reports whether the store has connected (see decide.Ready).
func (s *Store) Ready() bool { return s.up.Load() }

// connected returns nil once the store has connected, and otherwise
// ErrClosed or ErrConnecting (wrapping the last attempt's error).
func (s *Store) connected() error {
	switch {
	case s.closed.Load():
		return ErrClosed
	case s.up.Load():
		return nil
	}
	if err := s.last.Load(); err != nil {
		return fmt.Errorf("%w: %w", ErrConnecting, *err)
	}
	return ErrConnecting
}

// check checks rawURL and cfg, which no retry can fix, and returns cfg
// with its defaults, the client options the URL makes and whether it names
// a cluster.
func check(rawURL string, cfg Config) (Config, rueidis.ClientOption, bool, error) {
	cfg = cfg.withDefaults()
	opt, cluster, err := parseURL(rawURL, cfg)
	if err != nil {
		return cfg, opt, cluster, err
	}
	if cfg.MaxReply > 0 {
		// a refused reply fails its call: sent again, it would be refused again
		opt.DialCtxFn, opt.DisableRetry = boundDial(opt.DialCtxFn, cfg.MaxReply), true
	}
	switch {
	case strings.ContainsAny(cfg.KeyPrefix, "{}"):
		err = fmt.Errorf("redis store: KeyPrefix %q must not contain '{' or '}'", cfg.KeyPrefix)
	case cfg.MaxBatch < 1:
		err = fmt.Errorf("redis store: MaxBatch must be at least 1, got %d", cfg.MaxBatch)
	case cfg.MaxInFlight < 1:
		err = fmt.Errorf("redis store: MaxInFlight must be at least 1, got %d", cfg.MaxInFlight)
	case cfg.Timeout < 0 || cfg.ExpiryMargin < 0 || cfg.DialTimeout < 0 || cfg.ExpiryJitter < 0 || cfg.MaxReply < 0:
		err = errors.New("redis store: Timeout, ExpiryMargin, ExpiryJitter, DialTimeout and MaxReply must not be negative")
	}
	return cfg, opt, cluster, err
}

// newStore returns a Store of rawURL and cfg, not connected, with its
// workers started.
func newStore(rawURL string, cfg Config) (*Store, error) {
	cfg, opt, cluster, err := check(rawURL, cfg)
	if err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	s := &Store{
		url:     rawURL,
		opt:     opt,
		dialed:  make(chan struct{}),
		cfg:     cfg,
		cluster: cluster,
		margin:  strconv.FormatInt(cfg.ExpiryMargin.Milliseconds(), 10),
		calls:   make(chan *call, 4*cfg.MaxBatch*cfg.MaxInFlight),
		stop:    make(chan struct{}),
		base:    base,
		cancel:  cancel,
	}
	s.wg.Add(cfg.MaxInFlight)
	for range cfg.MaxInFlight {
		go s.worker()
	}
	return s, nil
}

// connect connects s to Redis, which must answer within ctx.
func (s *Store) connect(ctx context.Context) error {
	client, err := rueidis.NewClient(s.opt)
	if err != nil {
		return fmt.Errorf("redis store %s: %w", Redact(s.url), err)
	}
	sha, err := load(ctx, client)
	if err != nil {
		client.Close()
		return fmt.Errorf("redis store %s: %w", Redact(s.url), err)
	}
	s.client, s.sha = client, sha
	s.up.Store(true)
	return nil
}

// load loads the script on every node, which also checks that they
// answer, and returns its SHA1. Nodes that lose it later (a restart, a
// failover to a node that never saw it) get it again on NOSCRIPT.
func load(ctx context.Context, c rueidis.Client) (string, error) {
	var sha string
	for _, node := range c.Nodes() {
		v, err := node.Do(ctx, node.B().ScriptLoad().Script(takeScript).Build()).ToString()
		if err != nil {
			return "", fmt.Errorf("load script: %w", err)
		}
		sha = v
	}
	if sha == "" {
		return "", errors.New("load script: no node")
	}
	return sha, nil
}

// parseURL turns a store URL into rueidis options, and reports whether it
// names a cluster.
func parseURL(raw string, cfg Config) (rueidis.ClientOption, bool, error) {
	fail := func(why string) (rueidis.ClientOption, bool, error) {
		return rueidis.ClientOption{}, false, fmt.Errorf("redis store URL %s: %s", Redact(raw), why)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return fail("want redis://, rediss://, redis+cluster://, redis+sentinel:// or unix://")
	}
	k, ok := urlSchemes[scheme]
	if !ok {
		return fail(fmt.Sprintf("unknown scheme %q", scheme))
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return fail("query parameters are not supported")
	}
	// Each worker sends a whole batch at once, so rueidis's automatic
	// pipelining would only add two goroutine hand-offs per call (its
	// writer and reader): with a connection of its own, a call writes and
	// reads in the worker's goroutine, bounded by the call's deadline.
	opt := rueidis.ClientOption{
		DisableCache:          true,
		DisableAutoPipelining: true,
		Dialer:                netDialer(cfg.DialTimeout),
	}
	rest, why := userInfo(&opt, rest, k.unix)
	switch {
	case why != "":
		return fail(why)
	case !k.sentinel && (cfg.SentinelUsername != "" || cfg.SentinelPassword != ""):
		return fail("a sentinel's user or password is set, but the URL names no sentinel (want redis+sentinel://)")
	case k.unix:
		// One Redis at a socket's path, on the connections of a dialer of
		// unix sockets with the dial timeout; no database number (Redis
		// has SELECT, the URL no place for it), no TLS.
		if rest == "/" || strings.HasSuffix(rest, "/") {
			return fail("no socket path")
		}
		opt.InitAddress = []string{rest}
		opt.ForceSingleClient = true
		opt.DialCtxFn = dialUnix
		return opt, false, nil
	}
	if why := hostsAndPath(&opt, rest, k, cfg); why != "" {
		return fail(why)
	}
	if k.tls {
		if cfg.TLS != nil {
			opt.TLSConfig = cfg.TLS.Clone()
		} else {
			host := opt.InitAddress[0][:strings.LastIndexByte(opt.InitAddress[0], ':')]
			opt.TLSConfig = &tls.Config{ServerName: strings.Trim(host, "[]"), MinVersion: tls.VersionTLS12}
		}
	}
	return opt, k.cluster, nil
}

// urlKind is what a store URL's scheme says of the Redis it names.
type urlKind struct{ tls, cluster, sentinel, unix bool }

// urlSchemes are the schemes of a store URL.
var urlSchemes = map[string]urlKind{
	"redis":          {},
	"rediss":         {tls: true},
	"redis+cluster":  {cluster: true},
	"rediss+cluster": {cluster: true, tls: true},
	"redis+sentinel": {sentinel: true},
	"unix":           {unix: true},
}

// userInfo sets opt's user name and password from the user information
// that begins rest, a store URL after its scheme, and returns the rest, or
// why it cannot. In a unix:// URL the user information ends where the
// socket's absolute path starts, which may hold '@' itself.
func userInfo(opt *rueidis.ClientOption, rest string, unix bool) (string, string) {
	at := strings.LastIndexByte(rest, '@')
	if unix {
		slash := strings.IndexByte(rest, '/')
		if slash < 0 {
			return "", "want unix:///path/to/redis.sock"
		}
		if at = -1; slash > 0 {
			if rest[slash-1] != '@' {
				return "", "want unix:///path/to/redis.sock or unix://user:password@/path/to/redis.sock"
			}
			at = slash - 1
		}
	}
	if at < 0 {
		return rest, ""
	}
	user, pass, hasPass := strings.Cut(rest[:at], ":")
	var err error
	if opt.Username, err = url.PathUnescape(user); err != nil {
		return "", "bad user name"
	}
	if hasPass {
		if opt.Password, err = url.PathUnescape(pass); err != nil {
			return "", "bad password"
		}
	}
	return rest[at+1:], ""
}

// hostsAndPath sets opt's addresses, sentinel master set and database
// from rest, a store URL of kind k after its scheme and user information
// (host:port,...[/master][/db]), or returns why it cannot.
func hostsAndPath(opt *rueidis.ClientOption, rest string, k urlKind, cfg Config) string {
	hosts, path, _ := strings.Cut(rest, "/")
	if hosts == "" {
		return "no host"
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return "empty host"
		}
		if !strings.Contains(h, ":") || strings.HasSuffix(h, "]") {
			h += ":6379"
		}
		opt.InitAddress = append(opt.InitAddress, h)
	}
	parts := strings.Split(path, "/")
	if k.sentinel {
		if parts[0] == "" {
			return "want redis+sentinel://host:port/mastername"
		}
		opt.Sentinel.MasterSet = parts[0]
		opt.Sentinel.Dialer = opt.Dialer
		opt.Sentinel.Username, opt.Sentinel.Password = cfg.SentinelUsername, cfg.SentinelPassword
		// Besides Sentinel's +switch-master events, ask every few seconds,
		// so that a missed event does not bind the store to a demoted
		// master (rueidis recommends it).
		opt.Sentinel.TopologyRefreshInterval = 5 * time.Second
		parts = parts[1:]
	}
	if len(parts) > 1 {
		return "too many path elements"
	}
	if len(parts) == 1 && parts[0] != "" {
		if k.cluster {
			return "a cluster has no database number"
		}
		db, err := strconv.Atoi(parts[0])
		if err != nil || db < 0 {
			return fmt.Sprintf("database %q is not a number", parts[0])
		}
		opt.SelectDB = db
	}
	if !k.cluster && !k.sentinel {
		if len(opt.InitAddress) > 1 {
			return "several hosts: use redis+cluster:// or redis+sentinel://"
		}
		opt.ForceSingleClient = true
	}
	return ""
}

// dialUnix connects to the unix socket at path with d: rueidis's dialer
// for a unix:// store.
func dialUnix(ctx context.Context, path string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
	return d.DialContext(ctx, "unix", path)
}

func netDialer(timeout time.Duration) net.Dialer {
	return net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
}

// Redact returns a store URL with its password, if any, replaced by
// "xxxxx", for logs and errors.
func Redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	at := strings.LastIndexByte(rest, '@')
	if i := strings.Index(rest, "@/"); scheme == "unix" && i >= 0 {
		at = i // a socket's path may hold '@'
	}
	if at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
		}
	}
	return raw
}

// take decides one request of key in group: TakeAll of one.
func (s *Store) take(ctx context.Context, key, group string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, fmt.Errorf("redis take %s: %w", key, err)
	}
	if d, ok := local(l, cost); ok {
		return d, nil
	}
	c, _ := s.pool.Get().(*call)
	if c == nil {
		c = &call{n: 1, done: make(chan struct{}, 1)}
	}
	if err := s.prepare(c, ctx, s.name(key, group), l, cost); err != nil {
		s.pool.Put(c)
		return sluice.Decision{}, fmt.Errorf("redis take %s: %w", key, err)
	}
	if err := s.run(ctx, c); err != nil {
		// A call abandoned in flight may still be written by its worker:
		// it is left to the garbage collector, not reused.
		return sluice.Decision{}, fmt.Errorf("redis take %s: %w", key, err)
	}
	d, err := c.decision(l, cost)
	if err != nil {
		return d, fmt.Errorf("redis take %s: %w", key, err)
	}
	c.ctx, c.out, c.err = nil, nil, nil
	s.pool.Put(c)
	return d, nil
}

// prepare makes c the call of a Take of cost hits of l on the Redis key
// name, which local has let through.
func (s *Store) prepare(c *call, ctx context.Context, name string, l sluice.Limit, cost int64) error {
	c.ctx, c.slot = ctx, s.slot(name)
	c.keys = append(c.keysBuf[:0], name)
	var err error
	c.blob, err = s.limits.appendRequest(appendGroup(c.blobBuf[:0], modeWrite, 1), l, cost)
	return err
}

// TakeAll applies every request if all of them are allowed and none of
// them otherwise, writing request i's decision to ds[i]. It implements
// sluice.Store.
//
// Requests whose keys share a Redis Cluster slot (such as keys with one
// hash tag, or all keys outside a cluster) are decided by one script, at
// one instant of Redis's time, atomically. When the keys span several
// slots, TakeAll first asks every slot without writing and, only if all
// would allow, applies each slot's requests atomically: a concurrent
// request that changes a slot between the two steps can then make that
// slot deny while the others have already taken their hits. All-or-nothing
// is exact per slot, and across slots short of that race.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(ds) < len(reqs) {
		return fmt.Errorf("redis take all: %d decisions for %d requests", len(ds), len(reqs))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redis take all: %w", err)
	}
	switch len(reqs) {
	case 0:
		return nil
	case 1: // one request is all or nothing by itself: Take batches it with others
		var err error
		ds[0], err = s.take(ctx, reqs[0].Key, reqs[0].Group, reqs[0].Limit, reqs[0].Cost)
		return err
	}
	mode, remote := locals(reqs, ds)
	if len(remote) == 0 {
		return nil
	}
	names := s.names(reqs, remote)
	groups := s.bySlot(names, remote)
	if len(groups) > 1 && mode == modeAll {
		allowed, err := s.takeGroups(ctx, reqs, names, ds, groups, modeDryRun)
		if err != nil || !allowed {
			return err
		}
	}
	_, err := s.takeGroups(ctx, reqs, names, ds, groups, mode)
	return err
}

// locals decides the requests of a TakeAll that need no Redis (see
// local) into ds, and returns the others' indexes and the mode to decide
// them in: without writing (modeDryRun) when a request decided here was
// denied.
func locals(reqs []sluice.Request, ds []sluice.Decision) (byte, []int) {
	mode := modeAll
	remote := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if d, ok := local(r.Limit, r.Cost); ok {
			ds[i] = d
			if !d.Allowed {
				mode = modeDryRun
			}
			continue
		}
		remote = append(remote, i)
	}
	return mode, remote
}

// names returns the Redis keys of reqs[i], i in idx, at index i.
func (s *Store) names(reqs []sluice.Request, idx []int) []string {
	names := make([]string, len(reqs))
	for _, i := range idx {
		names[i] = s.name(reqs[i].Key, reqs[i].Group)
	}
	return names
}

// takeGroups decides each group of requests in one script call, all calls
// at once, and reports whether every decision allowed; names[i] is the
// Redis key of reqs[i].
func (s *Store) takeGroups(ctx context.Context, reqs []sluice.Request, names []string, ds []sluice.Decision, groups [][]int, mode byte) (bool, error) {
	calls := make([]*call, len(groups))
	for g, idx := range groups {
		var err error
		if calls[g], err = s.groupCall(ctx, reqs, names, idx, mode); err != nil {
			return false, err
		}
	}
	for _, c := range calls {
		if err := s.submit(ctx, c); err != nil {
			return false, fmt.Errorf("redis take all: %w", err)
		}
	}
	allowed := true
	for g, c := range calls {
		if err := s.wait(ctx, c); err != nil {
			return false, fmt.Errorf("redis take all: %w", err)
		}
		all, err := c.decisions(reqs, groups[g], ds)
		if err != nil {
			return false, fmt.Errorf("redis take all: %w", err)
		}
		allowed = allowed && all
	}
	return allowed, nil
}

// groupCall returns the call that decides the requests reqs[i], i in idx,
// whose Redis keys are names[i], in mode (modeAll or modeDryRun).
func (s *Store) groupCall(ctx context.Context, reqs []sluice.Request, names []string, idx []int, mode byte) (*call, error) {
	c := &call{ctx: ctx, slot: s.slot(names[idx[0]]), n: len(idx), done: make(chan struct{}, 1)}
	c.keys = make([]string, 0, len(idx))
	c.blob = appendGroup(make([]byte, 0, headerSize+requestSize*len(idx)), mode, len(idx))
	for _, i := range idx {
		c.keys = append(c.keys, names[i])
		var err error
		if c.blob, err = s.limits.appendRequest(c.blob, reqs[i].Limit, reqs[i].Cost); err != nil {
			return nil, fmt.Errorf("redis take all %s: %w", reqs[i].Key, err)
		}
	}
	return c, nil
}

// slot returns the cluster slot of the Redis key name, or 0 outside a
// cluster.
func (s *Store) slot(name string) uint16 {
	if !s.cluster {
		return 0
	}
	return Slot(name)
}

// name returns the Redis key of the state under key in group: the
// prefix, then, when group is not empty, group's hash tag, then key:
//
//	sluice:{9e107d9d}3f2a9c01d4e5b6a7|5:alice
//
// The tag is the FNV-1a hash of group in 8 hex digits, not group itself,
// so that a group of any bytes, braces included, makes a well-formed tag
// of a fixed size; groups that happen to share a tag only share a slot.
// The prefix has no braces, so the tag is the key's first, and decides its
// slot whatever key holds.
func (s *Store) name(key, group string) string {
	if group == "" {
		return s.cfg.KeyPrefix + key
	}
	var tag [10]byte
	tag[0], tag[9] = '{', '}'
	h := uint32(2166136261) // FNV-1a, 32 bits
	for i := 0; i < len(group); i++ {
		h ^= uint32(group[i])
		h *= 16777619
	}
	const hexDigits = "0123456789abcdef"
	for i := 8; i >= 1; i-- {
		tag[i] = hexDigits[h&0xf]
		h >>= 4
	}
	return s.cfg.KeyPrefix + string(tag[:]) + key
}

// Close stops the store's goroutines and closes the connections; callers
// waiting for a batch get ErrClosed. A script call in flight ends first,
// when Redis answers or at its deadline (at most Config.Timeout for calls
// without one). It is safe to call more than once.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		s.cancel()
		<-s.dialed
		s.wg.Wait()
		s.drain()
		if s.up.Load() {
			s.client.Close()
		}
	})
	return nil
}
