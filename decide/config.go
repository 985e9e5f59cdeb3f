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
// resets connections, errs, or the breaker keeps decisions away from it. A
// store that is only slow is not failing: see ModeSlow.
type Fail uint8

const (
	// FailOpen admits every request the store cannot decide: the limits
	// lapse while the store is down (the default).
	FailOpen Fail = iota
	// FailClosed denies every limited request the store cannot decide.
	FailClosed
	// FailLocal decides from Config.Local, an in-process store with the same
	// rules: each node then enforces the limits on its own.
	FailLocal
)

var failNames = [...]string{FailOpen: "open", FailClosed: "closed", FailLocal: "local"}

// String returns the mode as written in flags: "open", "closed" or "local".
func (f Fail) String() string {
	if int(f) < len(failNames) {
		return failNames[f]
	}
	return fmt.Sprintf("Fail(%d)", uint8(f))
}

// ParseFail returns the fail mode named s: "open", "closed" or "local".
func ParseFail(s string) (Fail, error) {
	for f, name := range failNames {
		if s == name {
			return Fail(f), nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (want open, closed or local)", s)
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
	// ModeLocal decides from Config.Local: the store failed, or was slow,
	// and Config.Fail is FailLocal.
	ModeLocal
	// ModeSlow denies: the store is alive but did not answer within
	// Config.StoreTimeout, and Config.Fail is not FailLocal. A slow store
	// keeps its limits; only a failing one (or the breaker) lifts them.
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
	case FailLocal:
		return ModeLocal
	}
	return ModeOpen
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
	// StoreTimeout bounds the store calls of one decision together; what
	// the store has not answered by then is denied (ModeSlow), or decided
	// by Local with FailLocal. Default 50ms. Negative means no timeout
	// beyond the caller's context. A store that is NonBlocking is called
	// without one.
	StoreTimeout time.Duration
	// Fail says how to decide while the store fails. Default FailOpen.
	Fail Fail
	// Local is the in-process store FailLocal decides from (store/memory).
	// Required with FailLocal, unused otherwise.
	Local sluice.Store
	// BreakerFailures is how many store calls in a row must fail before
	// the Service stops calling the store for BreakerCoolDown and decides
	// by Fail alone. Default 5. Negative disables the breaker: every
	// decision calls the store.
	BreakerFailures int
	// BreakerWindow is how long store calls that time out must go on
	// failing, with no success among them, before they open the breaker
	// too: a store slower than StoreTimeout for less than this is slow
	// (its decisions denied), not down. Default 2s.
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
		StoreTimeout:    50 * time.Millisecond, // a Redis round trip is ~0.1-1ms
		Fail:            FailOpen,              // a store outage lifts the limits, not the service
		BreakerFailures: 5,                     // in a row
		BreakerWindow:   2 * time.Second,       // longer than a fork's or a busy host's stall
		BreakerCoolDown: time.Second,           // then one probe
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
	case c.Fail > FailLocal:
		return c, fmt.Errorf("decide: unknown fail mode %d", c.Fail)
	case c.Fail == FailLocal && c.Local == nil:
		return c, errors.New("decide: fail mode local needs a local store")
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
