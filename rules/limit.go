package rules

import (
	"encoding/json"
	"fmt"
	"strconv"
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
	// Elastic admits up to the limit, and past it up to the limit × (1 +
	// ExceedPercent/100) while the domain's pool (Limit.Pool) has room.
	Elastic
)

// String returns "hard", "soft" or "elastic", as in rules files.
func (t Throttling) String() string {
	switch t {
	case Soft:
		return "soft"
	case Elastic:
		return "elastic"
	}
	return "hard"
}

// MarshalText implements encoding.TextMarshaler.
func (t Throttling) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Limit is one rate limit of a descriptor, as the rules file states it. A
// Limit belongs to an immutable Set and is never modified; it is safe for
// concurrent use.
type Limit struct {
	// Name is Envoy's optional `name` of the limit, which `replaces` refers to.
	Name string
	// Limit is the algorithm, rate, period and burst. Period is Unit ×
	// UnitMultiplier. The zero Limit when Unlimited; otherwise it passes
	// sluice.Limit.Validate.
	Limit sluice.Limit
	// Unit is the rules file's unit, in lower case: second, minute, hour,
	// day, week, month or year. Month is 30 days and year 365 days, as in
	// Envoy's ratelimit. Empty when Unlimited.
	Unit string
	// UnitMultiplier is sluice's `unit_multiplier`: 5 with unit minute is a
	// 5-minute window. At least 1 (0 when Unlimited).
	UnitMultiplier int64
	// Unlimited is Envoy's `unlimited: true`: the descriptor matches and is
	// never limited.
	Unlimited bool
	// Block is Envoy's `requests_per_unit: 0`: every request is over the
	// limit and nothing is counted. Limit then holds the algorithm and
	// period with a zero Rate, which is not a valid sluice.Limit: a
	// blocking limit is never taken from a store.
	Block bool
	// Throttling and ExceedPercent are sluice's `throttling` and
	// `exceed_percent` (`elastic_percent` with Elastic). ExceedPercent is
	// at least 1 with Soft and Elastic and 0 with Hard; Limit scaled by
	// (100 + ExceedPercent)/100 still validates and admits more.
	Throttling    Throttling
	ExceedPercent int64
	// Pool is, with Elastic, the domain's `capacity`: the shared limit
	// whose room lets the limit reach its ceiling (Ceiling). Its ID names
	// the domain's pool. Nil otherwise.
	Pool *Limit
	// Sync is sluice's `sync`: how a server decides this limit with a
	// shared store (store/localfirst): exact, lease, async, or
	// sluice.DefaultSync for the server's default (--sync). Lease and
	// async are for every algorithm but sliding_log.
	Sync sluice.Sync
	// Scope is sluice's `scope`: RegionScope (the default), a limit each
	// region enforces alone, or GlobalScope, one limit for all regions
	// together (store/regions), decided exactly in each region (Sync is
	// then Exact).
	Scope sluice.Scope
	// Replaces lists the names of limits this one replaces (Envoy's
	// `replaces`). Every name is the Name of a limit of the same domain.
	Replaces []string
	// ID identifies the limit's counter within its rules, for store keys
	// and metrics (16 hex digits). It is derived from what the limit
	// counts: the domain, the keys and values of the descriptors down to
	// the limit, and the limit's algorithm and period (Unit ×
	// UnitMultiplier, so 60 minutes is an hour), and a sliding_window's
	// precision above 1 (1 and none have the ID limits had before
	// precision existed). Change any of them and the
	// limit counts afresh; change requests_per_unit, burst, throttling,
	// shadow mode, the name, or reorder the file, and it keeps its count
	// (the stores apply the new rate to the state they hold). Limits of one
	// descriptor that share an algorithm and a period (in rate_limits) are
	// told apart by their order among themselves: the first of them has
	// the ID it would have alone, the second another, and so on; swapping
	// two of them swaps their counts.
	ID string
	// File and Line locate the limit in its rules file.
	File string
	Line int
}

// Period returns the limit's window: Unit × UnitMultiplier.
func (l *Limit) Period() time.Duration { return l.Limit.Period }

// Place returns where the limit is written, "file:line", or "" for a limit
// that no file holds (an override, a request's own limit).
func (l *Limit) Place() string {
	if l.File == "" {
		return ""
	}
	return l.File + ":" + strconv.Itoa(l.Line)
}

// Enforced returns the limit that decides whether a request passes: Limit
// with hard throttling, and with soft throttling Limit with its rate, and
// its burst if set, each scaled by (100 + ExceedPercent)/100 and rounded
// down, so that it admits up to the limit × (1 + ExceedPercent/100) and
// never more (a token bucket's refill rate grows by the same factor as its
// capacity). Loading checked that it validates and that it admits more than
// Limit: a soft limit whose excess rounds down to nothing (5 a minute with
// 10%) is refused. The zero sluice.Limit when Unlimited; with Block,
// Limit as it is (a zero rate), which is never taken from a store. It is
// the one implementation of soft throttling's arithmetic.
func (l *Limit) Enforced() sluice.Limit {
	if l.Throttling != Soft {
		return l.Limit
	}
	return softLimit(l.Limit, l.ExceedPercent)
}

// Excess returns, for an Elastic limit, the limit of what it admits past
// Limit: the ceiling (Limit with its rate and burst scaled by (100 +
// ExceedPercent)/100, rounded down, as soft throttling scales them) less
// Limit, so that Limit and Excess together admit up to the ceiling.
// Loading checked that it validates. The zero sluice.Limit otherwise.
func (l *Limit) Excess() sluice.Limit {
	if l.Throttling != Elastic {
		return sluice.Limit{}
	}
	c := softLimit(l.Limit, l.ExceedPercent)
	c.Rate -= l.Limit.Rate
	if c.Burst > 0 {
		c.Burst -= l.Limit.Burst
	}
	return c
}

// limitJSON is how a Limit shows in the rules in force (GET /v1/rules).
type limitJSON struct {
	ID              string     `json:"id"`
	Name            string     `json:"name,omitempty"`
	Unlimited       bool       `json:"unlimited,omitempty"`
	Block           bool       `json:"block,omitempty"`
	Unit            string     `json:"unit,omitempty"`
	UnitMultiplier  int64      `json:"unit_multiplier,omitempty"`
	RequestsPerUnit int64      `json:"requests_per_unit,omitempty"`
	Algorithm       string     `json:"algorithm,omitempty"`
	Burst           int64      `json:"burst,omitempty"`
	Precision       int64      `json:"precision,omitempty"`
	Period          string     `json:"period,omitempty"`
	Throttling      Throttling `json:"throttling"`
	ExceedPercent   int64      `json:"exceed_percent,omitempty"`
	ElasticPercent  int64      `json:"elastic_percent,omitempty"`
	Pool            string     `json:"pool,omitempty"`
	Sync            string     `json:"sync,omitempty"`
	Scope           string     `json:"scope,omitempty"`
	Replaces        []string   `json:"replaces,omitempty"`
	Line            int        `json:"line"`
}

// MarshalJSON renders l with the rules file's field names, plus its ID,
// its period as a Go duration ("5m0s") and block: true when it denies
// every request (requests_per_unit 0, left out).
func (l *Limit) MarshalJSON() ([]byte, error) {
	v := limitJSON{
		ID: l.ID, Name: l.Name, Unlimited: l.Unlimited, Block: l.Block, Throttling: l.Throttling,
		ExceedPercent: l.ExceedPercent, Sync: l.Sync.String(), Replaces: l.Replaces, Line: l.Line,
	}
	if l.Scope != sluice.RegionScope {
		v.Scope = l.Scope.String()
	}
	if l.Throttling == Elastic {
		v.ExceedPercent, v.ElasticPercent = 0, l.ExceedPercent
		if l.Pool != nil {
			v.Pool = l.Pool.ID
		}
	}
	if !l.Unlimited {
		v.Unit, v.UnitMultiplier = l.Unit, l.UnitMultiplier
		v.RequestsPerUnit, v.Burst, v.Precision = l.Limit.Rate, l.Limit.Burst, l.Limit.Precision
		v.Algorithm = l.Limit.Algorithm.String()
		v.Period = l.Limit.Period.String()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("limit %s: %w", l.ID, err)
	}
	return b, nil
}
