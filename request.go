package sluice

import (
	"context"
	"fmt"
	"strings"
)

// Request asks a Store to apply Cost hits of Limit to the state under Key.
// Everything a store layer needs to know about a request is a field of
// it: no layer reads meaning into the key string.
type Request struct {
	Key   string
	Limit Limit
	Cost  int64
	// Group names the requests a store keeps together: requests of equal
	// Group live where one atomic step can decide them all (store/redis
	// puts them in one Redis Cluster slot). Empty means the Key alone
	// decides where its state lives. A key is always given with the same
	// Group; the Group is not part of the key's identity for a store that
	// has no placement to make (store/memory ignores it), but it may be
	// for one that has (store/redis names the state by both).
	Group string
	// Sync is how a store that can decide locally decides the request
	// (the rule's `sync:`); the zero value leaves it to the store's
	// default. Stores that decide every request exactly ignore it.
	Sync Sync
	// Scope is whose limit the request counts against (the rule's
	// `scope:`): this region's (the zero value) or all regions' together,
	// which a store that knows the other regions (store/regions) keeps as
	// one limit. Other stores treat every request as RegionScope.
	Scope Scope
	// Envoy, when its Domain is not empty, is the descriptor under which
	// Envoy's ratelimit would count this request: the limit is one whose
	// counter Envoy's ratelimit could share (rules.Rule.EnvoyKeyed), and a
	// store that counts such limits as Envoy does (store/envoykeys) names
	// the counter from it instead of Key. Other stores ignore it. A store
	// reads it during the call and keeps none of it.
	Envoy Descriptor
}

// Descriptor is a descriptor as Envoy's ratelimit names its counter: the
// domain and the entries as they are counted, each value as the client
// sent it, or a share_threshold level's pattern.
type Descriptor struct {
	Domain  string
	Entries []Entry
}

// Entry is one key and value of a descriptor.
type Entry struct {
	Key   string `json:"key" yaml:"key"`
	Value string `json:"value" yaml:"value"`
}

// Sync says how a store that can decide locally (store/localfirst) decides
// a request. The zero value, DefaultSync, leaves it to the store.
type Sync uint8

// The sync modes. A store that decides every request exactly treats them
// all as Exact.
const (
	// DefaultSync is the store's own default mode.
	DefaultSync Sync = iota
	// Exact decisions are the store's: one store call per decision (a
	// near cache may answer a denied client until its retry time).
	Exact
	// Lease decisions come from leases: a node takes part of a hot key's
	// quota from the store and admits from it by itself, never over the
	// limit.
	Lease
	// Async decisions make no store call: a node admits from its share of
	// what the store counted left and writes its hits back later, over
	// the limit by at most a bound the store states.
	Async
	numSyncs
)

var syncNames = [numSyncs]string{DefaultSync: "", Exact: "exact", Lease: "lease", Async: "async"}

// String returns the mode's name as flags and rules write it: "exact",
// "lease", "async", or "" for DefaultSync.
func (s Sync) String() string {
	if s < numSyncs {
		return syncNames[s]
	}
	return fmt.Sprintf("Sync(%d)", s)
}

// ParseSync returns the mode named s: "exact", "lease", "async", or
// DefaultSync for "".
func ParseSync(s string) (Sync, error) {
	for i, name := range syncNames {
		if s == name {
			return Sync(i), nil
		}
	}
	return 0, fmt.Errorf("unknown sync mode %q (want %s)", s, strings.Join(syncNames[1:], ", "))
}

// Scope says whose limit a request counts against. The zero value,
// RegionScope, is the limit of the region that decides it.
type Scope uint8

// The scopes.
const (
	// RegionScope: each region enforces the limit alone.
	RegionScope Scope = iota
	// GlobalScope: one limit for all regions together.
	GlobalScope
	numScopes
)

var scopeNames = [numScopes]string{RegionScope: "region", GlobalScope: "global"}

// String returns the scope's name as rules write it: "region" or
// "global".
func (s Scope) String() string {
	if s < numScopes {
		return scopeNames[s]
	}
	return fmt.Sprintf("Scope(%d)", s)
}

// ParseScope returns the scope named s: "region", "global", or
// RegionScope for "".
func ParseScope(s string) (Scope, error) {
	if s == "" {
		return RegionScope, nil
	}
	for i, name := range scopeNames {
		if s == name {
			return Scope(i), nil
		}
	}
	return 0, fmt.Errorf("unknown scope %q (want region or global)", s)
}

// Store keeps the states of many keys and applies limits to them. Every
// implementation is safe for concurrent use and decides as the Limit
// transitions do for the same sequence of times and costs: exactly, or,
// for a store that decides locally and reconciles later
// (store/localfirst's lease and async modes), within a bound it states
// (store/storetest's contract tier checks every store, its exactness tier
// the exact ones).
//
// A key names one state: callers give different limits different keys. A
// store that finds a key under another algorithm than before starts it
// afresh. A store that cannot apply every limit Limit.Validate accepts
// implements LimitChecker, and its errors for such a limit wrap ErrLimit.
type Store interface {
	// TakeAll applies every request if all of them are allowed and none of
	// them otherwise, atomically, writing request i's decision to ds[i]
	// (len(ds) >= len(reqs)). When one is denied, the others report what
	// they would have decided. A key given twice sees its first request's
	// hits when deciding the second. A request's cost 0 only reports.
	TakeAll(ctx context.Context, reqs []Request, ds []Decision) error
}

// Take applies cost hits of l to key in s, a batch of one request with no
// group: cost 0 only reports.
func Take(ctx context.Context, s Store, key string, l Limit, cost int64) (Decision, error) {
	var d [1]Decision
	err := s.TakeAll(ctx, []Request{{Key: key, Limit: l, Cost: cost}}, d[:])
	return d[0], err
}
