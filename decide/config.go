package decide

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Fail says how the Service decides while its store fails or is slow.
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
	// ModeLocal decides from Config.Local: the store failed and Config.Fail
	// is FailLocal.
	ModeLocal

	// MaxMode is the largest Mode, for loops over every mode.
	MaxMode = ModeLocal
)

var modeNames = [...]string{ModeStore: "store", ModeOpen: "fail_open", ModeClosed: "fail_closed", ModeLocal: "local"}

// String returns the mode's name: "store", "fail_open", "fail_closed" or
// "local".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// fallback returns the Mode that fail mode f decides in.
func (f Fail) fallback() Mode {
	switch f {
	case FailClosed:
		return ModeClosed
	case FailLocal:
		return ModeLocal
	}
	return ModeOpen
}

// Config configures a Service. Start from DefaultConfig.
type Config struct {
	// Rules returns the rules in force; it is called once per decision and
	// must be safe for concurrent use (rules.Watcher's Current is). A nil
	// Set is a set without domains: every request is OK with no limit.
	Rules func() *rules.Set
	// Store keeps the counters. Required.
	Store sluice.Store
	// StoreTimeout bounds the store calls of one decision together; a call
	// that takes longer fails and Fail decides. Zero or negative means no
	// timeout beyond the caller's context; a store that is NonBlocking is
	// called without one. Default 50ms.
	StoreTimeout time.Duration
	// Fail says how to decide while the store fails. Default FailOpen.
	Fail Fail
	// Local is the in-process store FailLocal decides from (store/memory).
	// Required with FailLocal, unused otherwise.
	Local sluice.Store
	// BreakerFailures is how many store calls in a row must fail before
	// the Service stops calling the store for BreakerCoolDown and decides
	// by Fail alone. Zero or negative disables the breaker. Default 5.
	BreakerFailures int
	// BreakerCoolDown is how long the Service leaves the store alone once
	// the breaker opens; then one decision probes the store and, if it
	// succeeds, decisions go back to the store. Default 1s.
	BreakerCoolDown time.Duration
	// Logger receives the breaker's transitions (Warn, Info) and single
	// store failures (Debug). Default slog.Default().
	Logger *slog.Logger
	// Now is the breaker's clock. Default time.Now. The stores read their
	// own clocks.
	Now func() time.Time
}

// DefaultConfig returns a Config with every default filled in and no Rules
// or Store.
func DefaultConfig() Config {
	return Config{
		StoreTimeout:    50 * time.Millisecond,
		Fail:            FailOpen,
		BreakerFailures: 5,
		BreakerCoolDown: time.Second,
		Logger:          slog.Default(),
		Now:             time.Now,
	}
}
