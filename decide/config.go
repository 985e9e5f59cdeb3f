package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Fail says how the Service decides while its store fails: it refuses or
// resets connections, errs, does not answer within the store timeout, or
// the breaker keeps decisions away from it.
type Fail uint8

const (
	// FailLocal decides on this server, bounded, from what it knows (the
	// default): the last count the store returned for a key, this server's
	// share of the limit among the servers it counts, and the hits it
	// admitted itself, which it writes back to the store once the store
	// answers (Config.WriteBack). A client under its limit is admitted; a
	// client over it gets at most the bound docs/stores.md states.
	FailLocal Fail = iota
	// FailOpen admits every request the store cannot decide: the limits
	// lapse while the store is down. A store that is only slow keeps them:
	// a call over the store timeout is denied (ModeSlow) until the
	// breaker opens.
	FailOpen
	// FailClosed denies every limited request the store cannot decide.
	FailClosed
)

var failNames = [...]string{FailLocal: "local", FailOpen: "open", FailClosed: "closed"}

// String returns the mode as written in flags: "local", "open" or
// "closed".
func (f Fail) String() string {
	if int(f) < len(failNames) {
		return failNames[f]
	}
	return fmt.Sprintf("Fail(%d)", uint8(f))
}

// ParseFail returns the fail mode named s: "local", "open" or "closed".
func ParseFail(s string) (Fail, error) {
	for f, name := range failNames {
		if s == name {
			return Fail(f), nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (want local, open or closed)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (f Fail) MarshalText() ([]byte, error) {
	if int(f) >= len(failNames) {
		return nil, fmt.Errorf("unknown fail mode %d", uint8(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, so that a Fail can be
// a flag.TextVar.
func (f *Fail) UnmarshalText(b []byte) error {
	v, err := ParseFail(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Mode says where decisions come from: the store, or a fail mode while the
// store is failing.
type Mode uint8

const (
	// ModeStore decides from Config.Store.
	ModeStore Mode = iota
	// ModeOpen admits: the store failed and Config.Fail is FailOpen.
	ModeOpen
	// ModeClosed denies: the store failed and Config.Fail is FailClosed.
	ModeClosed
	// ModeLocal decides on this server (see FailLocal): the store failed,
	// or did not answer within the store timeout, and Config.Fail is
	// FailLocal.
	ModeLocal
	// ModeSlow denies: the store is alive but did not answer within the
	// store timeout, and Config.Fail is FailOpen or FailClosed, chosen
	// (never with the default, FailLocal). A slow store keeps its limits;
	// only a failing one (or the breaker) lifts them.
	ModeSlow

	// MaxMode is the largest Mode, for loops over every mode.
	MaxMode = ModeSlow
)

var modeNames = [...]string{ModeStore: "store", ModeOpen: "fail_open", ModeClosed: "fail_closed", ModeLocal: "local", ModeSlow: "slow"}

// String returns the mode's name: "store", "fail_open", "fail_closed",
// "local" or "slow".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Mode returns the Mode that fail mode f decides in.
func (f Fail) Mode() Mode {
	switch f {
	case FailClosed:
		return ModeClosed
	case FailOpen:
		return ModeOpen
	}
	return ModeLocal
}

// Config configures a Service. Start from DefaultConfig, or from the zero
// Config with Store set: a zero field means its default, as stated at each
// field and in DefaultConfig.
type Config struct {
	// Rules returns the rules in force; it is called once per decision and
	// must be safe for concurrent use (rules.Watcher's Current is). A nil
	// Set is a set without domains: every request is OK with no limit.
	// Default: no rules.
	Rules func() *rules.Set
	// Store keeps the counters. Required.
	Store sluice.Store
	// StoreTimeout is the least the store calls of one decision together
	// wait for the store: the timeout follows the store's latency, twice
	// the 99th percentile of its recent calls, at least StoreTimeout and at
	// most StoreMaxTimeout. What the store has not answered by then is
	// decided locally (FailLocal; the call goes on in the background, see
	// StoreHardTimeout), or denied (ModeSlow) with FailOpen and
	// FailClosed. Default 50ms. Negative means no timeout beyond the
	// caller's context. A store that is NonBlocking is called without one.
	StoreTimeout time.Duration
	// StoreMaxTimeout is the most the store timeout grows to, following a
	// slow store. Default 200ms; below StoreTimeout it is StoreTimeout: a
	// fixed timeout.
	StoreMaxTimeout time.Duration
	// StoreHardTimeout bounds a store call that went on past the store
	// timeout (FailLocal): its decision was made locally, and if the call
	// ends within this the store has counted it (nothing is written back);
	// if it fails, the hits admitted locally are written back. Default
	// 10s, longer than a stall of Redis (a fork, DEBUG SLEEP, a paused
	// host) lasts.
	StoreHardTimeout time.Duration
	// MaxLateCalls is the most store calls that may go on past the store
	// timeout at once (FailLocal); beyond it, decisions are made locally
	// without calling the store. Each holds a goroutine, about 8 KiB.
	// Default 1024.
	MaxLateCalls int
	// Fail says how to decide while the store fails or is slow. Default
	// FailLocal.
	Fail Fail
	// LedgerBytes bounds what FailLocal keeps per key, keys included: the
	// last count the store returned for the keys near their limits, the
	// local shares and the hits to write back. Default 8 MiB (about
	// 28,000 keys of 32 bytes).
	LedgerBytes int64
	// Servers returns how many servers share the store (store/stack's
	// count, from the heartbeats in Redis), at least 1: FailLocal admits
	// a key's limit divided among them. Default nil: 1.
	Servers func() int64
	// WriteBack writes to the store the hits FailLocal admitted that the
	// store did not count: reqs[i].Cost hits of reqs[i].Limit on
	// reqs[i].Key, admitted in the window that starts at windows[i] (µs
	// since the Unix epoch; 0 for a bucket limit), added whether or not
	// they fit (store/stack's WriteBack). Probe calls it once the store
	// answers. Default nil: such hits are not written back.
	WriteBack func(ctx context.Context, reqs []sluice.Request, windows []int64) error
	// Restore puts back counts the store lost (a restart without
	// persistence): reqs[i].Cost is what reqs[i].Limit, a fixed_window,
	// counted at least on reqs[i].Key in the window that starts at
	// windows[i] (µs, on the store's clock), merged by maximum
	// (store/stack's RestoreCounts). The ledger finds the loss when the
	// store counts a key decided exactly lower than it did earlier in the
	// same window, by more than a sixteenth of its limit, and when the
	// store answers again after failing (Probe). Default nil: lost counts
	// stay lost.
	Restore func(ctx context.Context, reqs []sluice.Request, windows []int64) error
	// Sync is the store's mode for requests whose Sync is
	// sluice.DefaultSync (store/stack's Config.Sync). The ledger never
	// takes a fall in the answers of a key in lease or async mode for a
	// lost count: they are a node's count, not the store's, and the node
	// finds a loss itself (store/localfirst). Default sluice.DefaultSync:
	// exact.
	Sync sluice.Sync
	// BreakerFailures is how many store calls in a row must fail before
	// the Service stops calling the store for BreakerCoolDown and decides
	// by Fail alone. Default 5. Negative disables the breaker: every
	// decision calls the store.
	BreakerFailures int
	// BreakerWindow is how long store calls that time out must go on
	// failing, with no success among them, before they open the breaker
	// too: a store slower than the store timeout for less than this is
	// slow (its decisions local, or denied with FailOpen and FailClosed),
	// not down. Default 2s.
	BreakerWindow time.Duration
	// BreakerCoolDown is how long the Service leaves the store alone once
	// the breaker opens; then one decision probes the store and, if it
	// succeeds, decisions go back to the store. Default 1s.
	BreakerCoolDown time.Duration
	// Ping asks the store whether it answers (store/stack's Ping), for
	// Probe: while decisions go without the store, a ping that succeeds
	// sends them back to it without waiting for a decision to probe.
	// Default nil: Probe does nothing.
	Ping func(context.Context) error
	// Logger receives the breaker's transitions (Warn, Info) and single
	// store failures (Debug). Default slog.Default().
	Logger *slog.Logger
	// Now is the breaker's clock. Default time.Now. The stores read their
	// own clocks.
	Now func() time.Time

	// EnvoyKeys says the Store counts the requests that carry an Envoy
	// descriptor (sluice.Request.Envoy) as Envoy's ratelimit counts them
	// (store/envoykeys): their hits stay counted when another limit denies
	// the request, so their Remaining is reported as counted, not with the
	// hits given back. Default false.
	EnvoyKeys bool

	// Shadow puts every limit in shadow mode, as Envoy's SHADOW_MODE does:
	// decided and counted, never enforced. A descriptor over its limit is
	// answered OK with Status.ShadowOverLimit, and so is the request.
	// Default false.
	Shadow bool
	// Observers are told of every decision, in this order, after it is
	// made and before Decide returns (see Observer, Starter). Default
	// none.
	Observers []Observer

	// Admit is the step of admission after the rate decision: package
	// admit's concurrency slots (a rule's Concurrency), which a Service
	// without one leaves alone (the first rule with one it decides is
	// logged at Warn). Default none.
	Admit Admitter

	// The caps on one request; a request beyond one is invalid
	// (ErrInvalidRequest, naming the cap). They cannot be lifted, only
	// set: negative is an error.

	// MaxDescriptors is the most descriptors of one request. Default 64.
	MaxDescriptors int
	// MaxEntries is the most entries of one descriptor. Default 32.
	MaxEntries int
	// MaxValueBytes is the longest key or value of an entry, in bytes.
	// Default 4096.
	MaxValueBytes int
	// DigestAbove is the length in bytes above which a descriptor's value
	// is kept in store keys as a digest of a fixed size (SHA-256 truncated
	// to 128 bits, in 29 bytes) instead of itself, so that long values
	// make short keys in every store. Default 256.
	DigestAbove int
}

// DefaultConfig returns a Config with every default filled in and no Rules
// or Store: what every zero field of a Config means.
func DefaultConfig() Config {
	return Config{
		StoreTimeout:     50 * time.Millisecond,  // the least: a Redis round trip is ~0.1-1ms, a busy one's p99 a few ms
		StoreMaxTimeout:  200 * time.Millisecond, // the most: past it a slow store's decisions are local
		StoreHardTimeout: 10 * time.Second,       // a store call decided locally goes on this long
		MaxLateCalls:     1024,                   // 8 MiB of goroutines at most
		Fail:             FailLocal,              // decide locally, bounded: neither deny nor lift the limits
		LedgerBytes:      8 << 20,                // 8 MiB
		// Servers: nil, 1; WriteBack, Restore: nil, none
		BreakerFailures: 5,               // in a row
		BreakerWindow:   2 * time.Second, // longer than a fork's or a busy host's stall
		BreakerCoolDown: time.Second,     // then one probe
		Logger:          slog.Default(),
		Now:             time.Now,
		MaxDescriptors:  64,                       // Envoy's filters send a handful
		MaxEntries:      32,                       // deeper than any rules tree in practice
		MaxValueBytes:   4096,                     // 4 KiB: a long URL, a JWT claim
		DigestAbove:     rules.DefaultDigestAbove, // 256: longer values cost a digest, shorter ones are kept as they are
	}
}

// withDefaults returns c with each zero field set to its default, or an
// error for a field no default can fix.
func (c Config) withDefaults() (Config, error) {
	def := DefaultConfig()
	switch {
	case c.Store == nil:
		return c, errors.New("decide: no store")
	case c.Fail > FailClosed:
		return c, fmt.Errorf("decide: unknown fail mode %d", c.Fail)
	case c.StoreMaxTimeout < 0 || c.StoreHardTimeout < 0 || c.MaxLateCalls < 0 || c.LedgerBytes < 0:
		return c, errors.New("decide: StoreMaxTimeout, StoreHardTimeout, MaxLateCalls and LedgerBytes must not be negative")
	case c.BreakerCoolDown < 0 || c.BreakerWindow < 0:
		return c, fmt.Errorf("decide: BreakerCoolDown %v and BreakerWindow %v must not be negative", c.BreakerCoolDown, c.BreakerWindow)
	case c.MaxDescriptors < 0 || c.MaxEntries < 0 || c.MaxValueBytes < 0 || c.DigestAbove < 0:
		return c, errors.New("decide: MaxDescriptors, MaxEntries, MaxValueBytes and DigestAbove must not be negative")
	}
	if c.Rules == nil {
		c.Rules = func() *rules.Set { return nil }
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = def.StoreTimeout
	}
	setZero(&c.StoreMaxTimeout, def.StoreMaxTimeout)
	setZero(&c.StoreHardTimeout, def.StoreHardTimeout)
	setZero(&c.MaxLateCalls, def.MaxLateCalls)
	setZero(&c.LedgerBytes, def.LedgerBytes)
	if c.BreakerFailures == 0 {
		c.BreakerFailures = def.BreakerFailures
	}
	if c.BreakerWindow == 0 {
		c.BreakerWindow = def.BreakerWindow
	}
	if c.BreakerCoolDown == 0 {
		c.BreakerCoolDown = def.BreakerCoolDown
	}
	if c.Logger == nil {
		c.Logger = def.Logger
	}
	if c.Now == nil {
		c.Now = def.Now
	}
	if c.MaxDescriptors == 0 {
		c.MaxDescriptors = def.MaxDescriptors
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = def.MaxEntries
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = def.MaxValueBytes
	}
	if c.DigestAbove == 0 {
		c.DigestAbove = def.DigestAbove
	}
	return c, nil
}

// setZero sets *v to def when it is zero.
func setZero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
