package rules

import (
	"time"

	"github.com/sluicehq/sluice"
)

// Throttling says what happens past a limit.
type Throttling uint8

const (
	// Hard denies every request past the limit (the default).
	Hard Throttling = iota
	// Soft admits up to the limit × (1 + ExceedPercent/100).
	Soft
)

// Limit is one rate limit of a descriptor, as the rules file states it.
type Limit struct {
	// Name is Envoy's optional `name` of the limit, which `replaces` refers to.
	Name string
	// Limit is the algorithm, rate, period and burst. Period is Unit ×
	// UnitMultiplier.
	Limit sluice.Limit
	// Unit is the rules file's unit: second, minute, hour, day, week, month
	// or year. Month is 30 days and year 365 days.
	Unit string
	// UnitMultiplier is sluice's `unit_multiplier`: 5 with unit minute is a
	// 5-minute window. At least 1.
	UnitMultiplier int64
	// Unlimited is Envoy's `unlimited: true`: the descriptor matches and is
	// never limited.
	Unlimited bool
	// Throttling and ExceedPercent are sluice's `throttling` and
	// `exceed_percent`.
	Throttling    Throttling
	ExceedPercent int64
	// Replaces lists the names of limits this one replaces (Envoy's
	// `replaces`).
	Replaces []string
	// ID identifies the limit within its rules for store keys and metrics:
	// stable across reloads while the limit's place and parameters do not
	// change.
	ID string
}

// Period returns the limit's window: Unit × UnitMultiplier.
func (l *Limit) Period() time.Duration { return l.Limit.Period }
